"""--config by name or by path: the configs bundled in the package, also through the checkout's configs/ link."""

from __future__ import annotations

from pathlib import Path

import pytest

from comera_lightning.cli import main
from comera_lightning.cli.config_files import CONFIG_DIR, bundled_configs, resolve_config
from tests.helpers.paths import ROOT


def test_configs_are_found_by_name_by_path_and_through_the_checkout_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"transformer_tiny", "dlrm_tiny", "codebert_tiny"} <= set(bundled_configs())
    bundled = str(CONFIG_DIR / "transformer_tiny.yaml")
    monkeypatch.chdir(tmp_path)  # outside the checkout
    assert resolve_config("transformer_tiny") == bundled == resolve_config("configs/transformer_tiny.yaml")
    assert (ROOT / "configs" / "transformer_tiny.yaml").resolve() == Path(bundled)
    own = tmp_path / "transformer_tiny.yaml"
    own.write_text("seed_everything: 1\n")
    assert resolve_config("transformer_tiny.yaml") == "transformer_tiny.yaml"  # a file given wins
    with pytest.raises(FileNotFoundError, match=r"no bundled config of that name\. \(bundled: codebert"):
        resolve_config("nothing_like_any")


@pytest.mark.parametrize("typo, meant", [("transformer_tinny", "transformer_tiny"), ("configs/dlrm_tin.yaml", "dlrm_tiny"), ("codebert_smal", "codebert_small")])
def test_a_misspelt_config_name_fails_on_one_line_naming_the_closest(typo: str, meant: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", typo])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert f"error: --config {typo}: " in err and f"did you mean {meant}?" in err
    assert all(name in err for name in bundled_configs())


def test_config_help_names_the_bundled_configs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    entry = out[out.index("-c CONFIG, --config CONFIG"):][:400]
    assert "name of a bundled one" in entry and all(name in entry for name in bundled_configs())
