"""kill -9 at random points of a short run, resume from last.ckpt, compare with the uninterrupted run.

Each attempt is a fresh process (tests/scripts/fault_run_script.py) killed a random time after it has
written a checkpoint; the last attempt runs to the end. Checked after every kill: last.ckpt loads
(never truncated) and no partial checkpoint file is left once the next run has saved.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from comera_lightning.checkpoint.io import partial_files
from tests.helpers.paths import ROOT, SCRIPTS

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "WANDB_MODE": "disabled"}


def _start(directory: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPTS / "fault_run_script.py"), str(directory)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen) -> None:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]


def _run_with_kills(directory: Path, seed: int, kills: int) -> int:
    """Kill ``kills`` runs at random moments after they have saved; returns how many kills hit a running job."""
    rng, hits = random.Random(seed), 0
    last = directory / "ckpt" / "last.ckpt"
    for _ in range(kills):
        before = last.stat().st_mtime_ns if last.exists() else None
        process = _start(directory)
        deadline = time.monotonic() + 240
        while process.poll() is None and (not last.exists() or last.stat().st_mtime_ns == before):
            assert time.monotonic() < deadline, "the run never saved a checkpoint"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.8))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            hits += 1
        process.communicate(timeout=60)
        torch.load(last, weights_only=False)  # whole, never truncated
    _finish(_start(directory))
    assert partial_files(directory / "ckpt") == [], "partial checkpoint files left behind"
    return hits


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("straight")
    _finish(_start(directory))
    return torch.load(directory / "final.pt", weights_only=False)


def _check(directory: Path, seed: int, kills: int, uninterrupted: dict) -> None:
    hits = _run_with_kills(directory, seed, kills)
    assert hits >= 1, "no kill landed while training ran: the test would prove nothing"
    resumed = torch.load(directory / "final.pt", weights_only=False)
    assert resumed["schedule"] == uninterrupted["schedule"]
    for name, expected in uninterrupted["state"].items():
        torch.testing.assert_close(resumed["state"][name], expected, rtol=0, atol=1e-5, msg=name)


def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path, uninterrupted):
    _check(tmp_path, seed=0, kills=2, uninterrupted=uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_killed_and_resumed_run_equals_the_uninterrupted_one_more_seeds(tmp_path, uninterrupted, seed):
    _check(tmp_path, seed=seed, kills=4, uninterrupted=uninterrupted)
