"""Shared test set-up: deterministic seeds, W&B never online, a MASTER_PORT per test, GPU tests skipped without CUDA,
slow ones unless asked."""

import os

import pytest
import torch

from tests.helpers.ports import free_port

os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process groups started by a test (and the processes it runs) meet on a port of this xdist worker's own."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_slow = pytest.mark.skip(reason="slow: run with `make test-slow` or `pytest -m slow`")
    slow_asked = "slow" in (config.getoption("markexpr") or "")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not slow_asked:
            item.add_marker(skip_slow)
