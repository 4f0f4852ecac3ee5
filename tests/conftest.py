"""Shared test set-up: deterministic seeds, W&B never online, a MASTER_PORT per test, GPU tests skipped without CUDA,
slow ones unless asked."""

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.ports import free_port

os.environ.setdefault("WANDB_MODE", "disabled")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist workers share the cores: one torch thread each, in the processes the tests start too. Two threads
    # per worker on two cores doubled the suite's CPU time (OpenMP threads spinning while they wait for a core).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process groups started by a test (and the processes it runs) meet on a port of this xdist worker's own."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope``, but only a module with module-scoped fixtures is one unit (its fixtures built once, on one
    worker); any other test is a unit alone. Whole modules as units left one of two workers 13 % behind the other."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = Path(__file__).parent
    shared = {p.relative_to(config.rootpath).as_posix() for p in root.rglob("test_*.py") if 'scope="module"' in p.read_text()}

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in shared else nodeid

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_slow = pytest.mark.skip(reason="slow: run with `make test-slow` or `pytest -m slow`")
    slow_asked = "slow" in (config.getoption("markexpr") or "")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not slow_asked:
            item.add_marker(skip_slow)
