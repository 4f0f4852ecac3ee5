"""Where the fused kernels run: CUDA tensors (or Triton's interpreter) with Triton installed; the torch path elsewhere."""

import importlib.util
import sys

import torch

from comera_lightning import TTEmbedding
from comera_lightning.layers.kernels import bags_reference, fused_kernels_apply, ops, two_factor_bags


def _factors():
    return torch.randn(6, 4, 5, requires_grad=True), torch.randn(7, 5, 3, requires_grad=True)


def test_cpu_tensors_take_the_torch_path_without_importing_the_kernels(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    left, right = _factors()
    ids, lengths = torch.tensor([1, 40, 41, 3]), torch.tensor([3, 0, 1])
    assert not fused_kernels_apply(left)
    out = two_factor_bags(left, right, ids, lengths, mean=True)
    assert "two_factor_bags" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, bags_reference(left, right, ids, lengths, mean=True))
    TTEmbedding(200, 12, max_rank=4, num_cores=2)(torch.tensor([[3, 199]])).sum().backward()
    if not torch.cuda.is_available():
        assert "comera_lightning.layers.kernels.triton_bags" not in sys.modules


def test_without_triton_the_torch_path_runs_even_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(ops, "_TRITON", False)  # what triton_usable() found where Triton does not import
    left, right = _factors()
    assert not fused_kernels_apply(left)
    out = two_factor_bags(left, right, torch.tensor([0, 41]), torch.tensor([2]))
    assert "two_factor_bags" not in type(out.grad_fn).__name__


def test_comera_fused_kernels_0_turns_them_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(ops, "_TRITON", True)
    left, _ = _factors()
    assert fused_kernels_apply(left)
    monkeypatch.setenv("COMERA_FUSED_KERNELS", "0")
    assert not fused_kernels_apply(left)


def test_weights_that_need_a_gradient_take_the_torch_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(ops, "_TRITON", True)
    left, right = _factors()
    weights = torch.rand(2, requires_grad=True)
    out = two_factor_bags(left, right, torch.tensor([0, 41]), torch.tensor([2]), weights)
    assert "two_factor_bags" not in type(out.grad_fn).__name__
    out.sum().backward()
    assert weights.grad is not None


def test_triton_usable_says_whether_triton_is_installed(monkeypatch):
    monkeypatch.setattr(ops, "_TRITON", None)  # not asked yet
    assert ops.triton_usable() == (importlib.util.find_spec("triton") is not None)
