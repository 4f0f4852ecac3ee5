"""``--weights_from``: a fit starts from a dense checkpoint's weights; with tensorize.init svd the trained model is compressed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from comera_lightning import ComeraCallback
from comera_lightning.cli.app import ComeraCLI
from tests.helpers.cli_runs import ROOT, small

CONFIG = ROOT / "configs" / "transformer_tiny.yaml"
QUICK = ["--trainer.max_epochs", "1", "--trainer.max_steps", "20", "--trainer.limit_train_batches", "20",
         "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false"]


def fit(tmp_path: Path, *extra: str) -> ComeraCLI:
    return ComeraCLI(args=["fit", *small(CONFIG), *QUICK, "--trainer.default_root_dir", str(tmp_path), *extra])


def test_a_dense_checkpoint_is_compressed_from_its_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.chdir(tmp_path)
    dense = fit(tmp_path, "--dense", "true")
    checkpoint = Path(dense.trainer.checkpoint_callback.last_model_path)
    compressed = fit(tmp_path, "--weights_from", str(checkpoint), "--comera.tensorize.init", "svd",
                     "--comera.budget.early_epochs", "null", "--comera.budget.late_epochs", "null")
    assert f"--weights_from: the model starts from the weights of {checkpoint}" in caplog.text
    assert "from trained weights (init='svd'): early stage = 1 of 8 steps" in caplog.text  # 256 pairs: 8 batches
    callback = next(c for c in compressed.trainer.callbacks if isinstance(c, ComeraCallback))
    assert callback.stage == "final" and compressed.trainer.global_step == 8
    assert re.search(r"tensorized layers end at [\d,]+ parameters, the budget asked [\d,]+ \([+-]\d\.\d%\)\.", caplog.text)
    tensorized = Path(compressed.trainer.checkpoint_callback.last_model_path)
    with pytest.raises(ValueError, match="holds tensorized layers: resume it with --ckpt_path"):
        fit(tmp_path, "--weights_from", str(tensorized))


def test_a_missing_file_or_a_resume_is_refused_before_training(tmp_path: Path, capsys) -> None:
    with pytest.raises(FileNotFoundError, match="--weights_from .*nowhere.ckpt: no such file"):
        fit(tmp_path, "--weights_from", str(tmp_path / "nowhere.ckpt"))
    with pytest.raises(SystemExit):
        fit(tmp_path, "--weights_from", "a.ckpt", "--ckpt_path", "b.ckpt")
    assert "use it with fit, without --ckpt_path" in capsys.readouterr().err
    junk = tmp_path / "junk.ckpt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        fit(tmp_path, "--weights_from", str(junk))
