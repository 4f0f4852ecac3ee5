"""The CLI's parser: no abbreviations, one-line errors naming the closest valid keys."""

from __future__ import annotations

import pytest

from comera_lightning.cli import main
from comera_lightning.cli.parser import closest_keys


@pytest.mark.parametrize("args,named", [
    (["--trainer.max_epoch", "1"], "trainer.max_epochs"),  # an abbreviation is refused
    (["--comera.max_rnak", "3"], "comera.max_rank"),
    (["--comera.target_ratio", "2"], "target_ratio must be a number in (0.0, 1.0]"),
    (["--threads", "0"], "--threads must be 1 or more"),
    (["--comera.budget.cut", "SVD"], "Parser key \"cut\": Expected a typing.Literal['gates', 'svd']. Got value: SVD"),
])
def test_bad_options_fail_on_one_line(args: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "transformer_tiny", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err


def test_closest_keys_prefers_the_same_section() -> None:
    known = ["trainer.max_epochs", "trainer.min_epochs", "comera.max_rank", "model"]
    assert closest_keys("trainer.max_epoch", known)[0] == "trainer.max_epochs"
    assert closest_keys("comera.max_rnak", known) == ["comera.max_rank"]
