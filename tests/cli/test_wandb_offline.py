"""An offline W&B run read back without a server: the nested config, the images, the summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from comera_lightning.cli.wandb_offline import read_offline_run
from tests.helpers.paths import ROOT

TINY = [
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1",
    "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
    "--data.init_args.limit_train_samples", "256", "--data.init_args.limit_eval_samples", "64",
    "--comera.early_epochs", "null", "--comera.late_epochs", "null", "--comera.prune_every_n_epochs", "null",
    "--comera.early_steps", "2", "--comera.late_steps", "2", "--threads", "1",
]


def test_wandb_offline_run_holds_the_nested_config_images_and_summary(tmp_path: Path) -> None:
    # Its own process, as a user runs it: W&B's service is per process, and an earlier run in this one may hold it
    # (and leave WANDB_SERVICE in the environment, which would send the child's run to that service: no .wandb file).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env = {**inherited, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "COMERA_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "comera_lightning", "fit", "--config", "transformer_tiny", *TINY,
               "--test_after_fit", "true", "--comera.rank_weight", "0.02"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = next(tmp_path.glob("logs/wandb/offline-run-*"))
    run = read_offline_run(run_dir)
    config = run["config"]
    assert config["comera"]["budget"]["target_ratio"] == 0.3 and config["comera"]["rank_weight"] == 0.02
    assert config["comera"]["early_steps"] == 2 and config["comera"]["tensorize"]["max_rank"] == 16
    assert config["comera"]["early_epochs"] is None and "max_rank" in config["comera"], "unset values are recorded too"
    assert config["seed_everything"] == 0 and config["trainer"]["max_epochs"] == 1
    assert config["model"]["init_args"]["vocab_size"] > 0  # the value linked from the data module, filled in
    assert "vocab_size" not in config and "d_model" not in config, "no flat duplicates of the nested keys"
    assert run["summary"]["final/compression_tt"] > 1 and "final/test/acc" in run["summary"]
    keys = {k for row in run["history"] for k in row}
    assert "comera/compression_tt" in keys and "test/acc" in keys  # fit and test in the same run
    assert any(k.startswith("comera/rank/") for k in keys) and not any(k.count("/") > 2 and k.startswith("comera/rank/") and k.rsplit("/", 1)[1].isdigit() for k in keys)
    images = {p.name.rsplit("_", 2)[0] for p in run_dir.glob("files/media/images/comera/*.png")}
    assert images == {"compression_plot", "rank_heatmap"}
