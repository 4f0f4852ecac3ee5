"""The wheel as a user gets it: built, installed with the ``cli`` extra in a fresh venv, run outside the checkout.

Slow (about 2-4 minutes on 2 shared CPU cores, most of it pip): ``make test-wheel`` or
``pytest -m slow tests/test_wheel_install.py``. torch==2.13.0 is installed first so the CPU
wheel is used (an unpinned torch would pull the CUDA build); the rest comes from the package registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from comera_lightning.cli.config_files import bundled_configs

ROOT = Path(__file__).resolve().parent.parent
TINY_RUN = [
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1",
    "--trainer.enable_progress_bar", "false", "--data.init_args.limit_train_samples", "256",
    "--data.init_args.limit_eval_samples", "64", "--comera.early_epochs", "null", "--comera.late_epochs", "null",
    "--comera.prune_every_n_epochs", "null", "--comera.early_steps", "2", "--comera.late_steps", "2", "--threads", "1",
    "--trainer.log_every_n_steps", "1",
]


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_the_tiny_config_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(WANDB_MODE="offline", COMERA_CACHE_DIR=str(tmp_path / "cache"))
    # Built from a copy of the tracked files: a build/ left in the checkout could slip stale modules into the wheel.
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, tracked):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():
            target.symlink_to(os.readlink(ROOT / name))
        elif (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)], tmp_path, env)
    wheel = next(dist.glob("comera_lightning-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"comera_lightning/cli/configs/{n}.yaml" for n in bundled_configs()} <= set(names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    _run([*pip, "torch==2.13.0"], tmp_path, env)
    _run([*pip, f"{wheel}[cli]"], tmp_path, env)

    work = tmp_path / "elsewhere"
    work.mkdir()
    command = venv / "bin" / "comera-lightning"
    refused = subprocess.run([str(command), "fit", "--config", "transformer_tiny", "--trainer.max_epoch", "1"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--trainer.max_epoch" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    _run([str(command), "fit", "--config", "transformer_tiny", *TINY_RUN], work, env)
    assert next(work.glob("logs/transformer_tiny/version_0/compression.png"))
    reader = [str(venv / "bin" / "python"), "-c",
              "import json, sys; from comera_lightning.cli.wandb_offline import read_offline_run; "
              "print(json.dumps(read_offline_run(sys.argv[1])['config']))", str(next(work.glob("logs/wandb/offline-run-*")))]
    config = json.loads(_run(reader, work, env).stdout)
    assert config["comera"]["budget"]["target_ratio"] == 0.3 and config["comera"]["early_steps"] == 2
    assert config["seed_everything"] == 0 and config["trainer"]["max_epochs"] == 1
