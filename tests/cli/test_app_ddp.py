"""Each workload config through the CLI on 2 CPU processes (DDP, gloo): same weights and stage decisions on both.

The tiny configs with a short step-based schedule (2 early steps, then a prune every step) and a
high gate learning rate, so that bonds are pruned, some to rank 0, while DDP runs.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.cli_runs import DATA_OVERRIDES
from tests.helpers.paths import CONFIGS, ROOT, SCRIPTS

SCHEDULE = [
    "--trainer.max_epochs", "3", "--trainer.max_steps", "6", "--trainer.limit_train_batches", "6",
    "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false",
    "--trainer.log_every_n_steps", "1",
    "--comera.early_epochs", "null", "--comera.late_epochs", "null", "--comera.prune_every_n_epochs", "null",
    "--comera.early_steps", "2", "--comera.prune_every_n_steps", "1", "--comera.gate_lr", "0.5",
]
# One config in the default run; the other two (each 2 processes, 25-40 s) under -m slow.
WORKLOADS = ["transformer_tiny", pytest.param("codebert_tiny", marks=pytest.mark.slow),
             pytest.param("dlrm_tiny", marks=pytest.mark.slow)]


def run_two_processes(config: str, out: Path, extra: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
           "COMERA_CACHE_DIR": str(out.parent / "cache")}
    args = [sys.executable, str(SCRIPTS / "ddp_cli_script.py"), str(CONFIGS / f"{config}.yaml"), str(out), *extra]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def rank_free(objective: dict) -> dict:
    """The objective's state without the cut watch's running sums: each rank sums its own batches' losses (the
    decisions use their mean over ranks, so the reference it keeps is the same on both)."""
    return {**objective, "watch": {k: v for k, v in objective["watch"].items() if k != "state"}}


@pytest.mark.parametrize("config", WORKLOADS)
def test_config_under_two_process_ddp_prunes_identically_on_both_ranks(tmp_path, config):
    out = tmp_path / "run"
    out.mkdir()
    first, second = run_two_processes(config, out, [*DATA_OVERRIDES.get(config, []), *SCHEDULE])
    assert first["step"] == second["step"] == 6
    assert first["schedule"] == second["schedule"] and first["schedule"]["prune_events"] >= 4
    assert first["l0"] == second["l0"] and rank_free(first["objective"]) == rank_free(second["objective"])
    assert first["ranks"] == second["ranks"]
    assert first["params_tt"][-1] < first["params_tt"][0], "pruned physically (the CLI's metrics.csv)"
    for name, value in first["state"].items():
        assert torch.equal(value, second["state"][name]), name
    assert first["last"], "a last.ckpt was written"
    assert first["test"] and first["test"] == second["test"], "test metrics are synchronised"
