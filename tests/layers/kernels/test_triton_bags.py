"""The Triton kernels against the torch path, on CPU under Triton's interpreter, in a fresh process.

Triton decides whether its kernels (and ``triton.language``'s own) are interpreted when it imports them, and other
tests of a session may import Triton first (torch.compile does): ``tests/scripts/interpreted_kernels_script.py`` runs
under pytest in a process started with ``TRITON_INTERPRET=1``. Skipped when Triton is not installed.
"""

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT, SCRIPTS


def test_the_kernels_equal_the_torch_path_under_the_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'comera_lightning[gpu]')")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SCRIPTS / "interpreted_kernels_script.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary
