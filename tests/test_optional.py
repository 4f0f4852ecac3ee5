"""The core imports with torch, lightning, torchmetrics and numpy alone; optional packages load on first use."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import ROOT


def test_core_imports_without_the_cli_extra() -> None:
    # An import of an optional package made directly by a comera_lightning module fails (Lightning and
    # torchmetrics import some of them on their own when installed: those are allowed through).
    blocked = ("tokenizers", "pyarrow", "matplotlib", "wandb", "jsonargparse", "torchrec", "transformers", "triton")
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] not in {blocked!r}: return None\n"
        "        frame = sys._getframe(1)\n"
        "        while frame and frame.f_globals.get('__name__', '').startswith(('importlib', '_frozen_importlib')):\n"
        "            frame = frame.f_back\n"
        "        if frame and frame.f_globals.get('__name__', '').startswith('comera_lightning'):\n"
        "            raise ModuleNotFoundError(f\"{frame.f_globals['__name__']} imports {name}\")\n"
        "sys.meta_path.insert(0, Block())\n"
        "import comera_lightning, comera_lightning.data, comera_lightning.models, comera_lightning.strategy\n"
        "from comera_lightning import ComeraCallback, TTLinear, tensorize\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_installed_imports_what_it_can_and_returns_none_for_the_rest() -> None:
    import json

    from comera_lightning._optional import installed

    assert installed("json") is json
    assert installed("a_package_nobody_installed") is None


def test_the_suite_collects_without_torchrec() -> None:
    # The GPU image has no TorchRec: its test modules skip there instead of stopping `pytest -m gpu` at collection
    # (found on the H200, 2026-11-30: ten modules imported the click-log data at the top).
    code = ("import sys; sys.modules['torchrec'] = None\n"
            "import pytest; sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "could not import 'torchrec'" in done.stdout
