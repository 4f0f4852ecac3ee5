"""``comera-lightning export`` / ``predict --program`` on each tiny config: checkpoint -> file -> test-split predictions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from comera_lightning.cli import main
from comera_lightning.cli.app import ComeraCLI
from comera_lightning.cli.export import model_inputs
from comera_lightning.export.dlrm import feature_names, is_dlrm
from tests.helpers.cli_runs import FEW_STEPS, small
from tests.helpers.paths import CONFIGS

CONFIGS = {name: CONFIGS / f"{name}.yaml" for name in ("transformer_tiny", "dlrm_tiny", "codebert_tiny")}
# Fit, export and predict each take a few seconds; the default run checks one config, -m slow the other two.
PARAMS = [pytest.param("transformer_tiny"), pytest.param("dlrm_tiny", marks=pytest.mark.slow),
          pytest.param("codebert_tiny", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", PARAMS)
def test_export_then_predict_from_the_command_line(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    config = small(CONFIGS[name])
    fit = ComeraCLI(args=["fit", *config, *FEW_STEPS, "--trainer.default_root_dir", str(tmp_path)])
    checkpoint = tmp_path / "trained.ckpt"
    fit.trainer.save_checkpoint(checkpoint)  # what ModelCheckpoint writes (not every tiny config keeps a last.ckpt)
    out = tmp_path / "model.pt2"

    main(["export", *config, "--ckpt_path", str(checkpoint), "--out", str(out)])
    printed = capsys.readouterr().out
    assert out.is_file() and "exported" in printed and 'export (prefer="size")' in printed  # the per-layer table, by default "size"
    with pytest.raises(SystemExit):  # never over an existing file without --overwrite
        main(["export", *config, "--ckpt_path", str(checkpoint), "--out", str(out)])
    assert "--overwrite" in capsys.readouterr().err

    predictions = tmp_path / "predictions.pt"
    main(["predict", *config, "--program", str(out), "--predictions", str(predictions)])
    assert "predicted" in capsys.readouterr().out

    trained = fit.model.eval()
    names = feature_names(trained) if is_dlrm(trained) else None
    datamodule = fit.datamodule
    datamodule.setup("test")
    with torch.no_grad():
        expected = [trained(b.dense, b.sparse) if names else trained(*model_inputs(b)) for b in datamodule.test_dataloader()]
    expected = torch.cat([e.flatten(0, -2) if e.dim() > 2 else e for e in expected])
    torch.testing.assert_close(torch.load(predictions), expected, rtol=1e-4, atol=1e-5)


def test_a_missing_checkpoint_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--ckpt_path"):
        main(["export", *small(CONFIGS["transformer_tiny"]), "--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "m.pt2")])


def test_an_unknown_prefer_is_refused_naming_the_choices(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["export", *small(CONFIGS["transformer_tiny"]), "--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "m.pt2"),
              "--prefer", "fast"])
    assert "invalid choice: 'fast'" in (err := capsys.readouterr().err) and "'size', 'speed'" in err
