"""The Triton kernels against the torch path, on CPU under Triton's interpreter, in a fresh process.

Triton decides whether its kernels (and ``triton.language``'s own) are interpreted when it imports them, and other
tests of a session may import Triton first (torch.compile does): ``tests/scripts/interpreted_kernels_script.py`` runs
under pytest in a process started with ``TRITON_INTERPRET=1``; on a GPU (``-m gpu``) the same script with the kernels
compiled for it. Skipped when Triton is not installed.
"""

import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.paths import ROOT, SCRIPTS


def _run_kernel_tests(allow_skips: bool = False, **variables: str) -> None:
    pytest.importorskip("triton", reason="Triton is not installed (pip install 'comera_lightning[gpu]')")
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, **variables,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SCRIPTS / "interpreted_kernels_script.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and (allow_skips or "skipped" not in summary), summary


def test_the_kernels_equal_the_torch_path_under_the_interpreter():
    _run_kernel_tests(TRITON_INTERPRET="1")


@pytest.mark.gpu
def test_the_kernels_equal_the_torch_path_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _run_kernel_tests(allow_skips=True, COMERA_KERNELS_DEVICE="cuda")  # the TorchRec test skips where TorchRec is not installed
