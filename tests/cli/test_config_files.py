"""--config by name or by path: the configs bundled in the package, also through the checkout's configs/ link."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    with pytest.raises(FileNotFoundError, match="bundled: codebert"):
        resolve_config("transformer_tny")
