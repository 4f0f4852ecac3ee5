"""The two-factor lookup as custom ops over the Triton kernels, and the choice of kernel, whole table or torch path.

``comera::two_factor_bags`` (forward) and ``comera::two_factor_bags_backward`` are ``torch.library`` custom ops, opaque to
torch.compile (their fake implementations give the shapes), so a compiled model keeps them as one node each and a CUDA
graph captures their launches. :func:`two_factor_rows` and :func:`two_factor_bags` take the kernels where
:func:`fused_kernels_apply`, else the torch path (``reference.py``). On the kernels' devices, where a step looks up about
as many ids as the table has rows, the whole table is built instead (``full_table.py``: one GEMM, a dense embedding's
backward, no atomics: :func:`whole_table_applies`).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from comera_lightning._optional import installed
from comera_lightning.layers.kernels.full_table import full_table_bags, full_table_fits, full_table_pays, full_table_rows
from comera_lightning.layers.kernels.reference import bags_reference, rows_reference

__all__ = ["fused_kernels_apply", "triton_usable", "two_factor_bags", "two_factor_rows", "whole_table_applies"]


@torch.compiler.assume_constant_result
def triton_usable() -> bool:
    """Whether Triton imports here (asked once per process; a compiled graph takes the answer as a constant)."""
    global _TRITON
    if _TRITON is None:
        _TRITON = installed("triton") is not None
    return _TRITON


_TRITON: bool | None = None


def _on_kernel_device(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def fused_kernels_apply(tensor: torch.Tensor) -> bool:
    """The kernels run on CUDA tensors, or on CPU under Triton's interpreter (``TRITON_INTERPRET=1``), with Triton
    installed; never inside ``torch.export`` (an exported program must load with torch alone) nor with
    ``COMERA_FUSED_KERNELS=0`` (the torch path everywhere: to compare, or to rule the kernels out)."""
    if not _on_kernel_device(tensor):  # (first: the CPU path pays one check)
        return False
    return os.environ.get("COMERA_FUSED_KERNELS") != "0" and not torch.compiler.is_exporting() and triton_usable()


def whole_table_applies(tensor: torch.Tensor, n_rows: int, width: int, n_lookups: int) -> bool:
    """Whether ``n_lookups`` ids of a two-factor table of ``n_rows`` x ``width`` go through the whole table
    (``full_table.py``): on the kernels' devices (with or without Triton) where it pays (``full_table_pays``);
    ``COMERA_WHOLE_TABLE=1``: on any device wherever it fits (the step account counts a GPU's route so on CPU);
    ``COMERA_WHOLE_TABLE=0``: never. Never inside ``torch.export`` (the serving forms are the exported ones)."""
    forced = os.environ.get("COMERA_WHOLE_TABLE")
    if forced == "0" or torch.compiler.is_exporting():
        return False
    if forced == "1":
        return full_table_fits(n_rows, width)
    return _on_kernel_device(tensor) and full_table_pays(n_rows, width, n_lookups)


def _kernels() -> Any:
    from comera_lightning.layers.kernels import triton_bags  # (imports Triton: only where a kernel runs)

    return triton_bags


@torch.library.custom_op("comera::two_factor_bags", mutates_args=())
def _bags_op(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None,
             weights: torch.Tensor | None, mean: bool) -> torch.Tensor:
    return _kernels().launch_forward(left, right, ids, offsets, weights, mean)


@_bags_op.register_fake
def _(left, right, ids, offsets, weights, mean):
    bags = ids.shape[0] if offsets is None else offsets.shape[0] - 1
    return left.new_empty(bags, left.shape[1] * right.shape[2])


@torch.library.custom_op("comera::two_factor_bags_backward", mutates_args=())
def _bags_backward_op(grad: torch.Tensor, left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, bag_of: torch.Tensor,
                      scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _kernels().launch_backward(grad, left, right, ids, bag_of, scales)


@_bags_backward_op.register_fake
def _(grad, left, right, ids, bag_of, scales):
    return torch.empty_like(left), torch.empty_like(right)


def _setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    left, right, ids, offsets, weights, mean = inputs
    ctx.save_for_backward(left, right, ids, offsets, weights)
    ctx.mean = mean


def _backward(ctx: Any, grad: torch.Tensor) -> tuple:
    """Each id's bag and scale (weight, over the bag's length for a mean) in torch, then the kernel."""
    left, right, ids, offsets, weights = ctx.saved_tensors
    if offsets is None:
        bag_of, lengths = torch.arange(ids.numel(), device=ids.device), None
    else:
        lengths = offsets.diff()
        bag_of = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths, output_size=ids.numel())
    scales = torch.ones(ids.shape, dtype=torch.float32, device=ids.device) if weights is None else weights.float()
    if ctx.mean and lengths is not None:
        scales = scales / lengths.clamp(min=1).float()[bag_of]
    grad_left, grad_right = _bags_backward_op(grad, left, right, ids, bag_of, scales)
    return grad_left, grad_right, None, None, None, None


_bags_op.register_autograd(_backward, setup_context=_setup_context)


def _whole_table(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor) -> bool:
    return whole_table_applies(left, left.shape[0] * right.shape[0], left.shape[1] * right.shape[2], ids.numel())


def two_factor_rows(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``(len(ids), M_L·M_R)`` rows of the table ``left`` ``(N_L, M_L, r)`` and ``right`` ``(N_R, r, M_R)`` hold."""
    if _whole_table(left, right, ids):
        return full_table_rows(left, right, ids)
    if not fused_kernels_apply(left):
        return rows_reference(left, right, ids)
    return _bags_op(left.contiguous(), right.contiguous(), ids, None, None, False)


def two_factor_bags(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor,
                    weights: torch.Tensor | None = None, *, mean: bool = False) -> torch.Tensor:
    """``(len(lengths), M_L·M_R)``: each bag's sum or mean (``weights``: per id) of its ids' rows; an empty bag gives 0.

    Weights that need a gradient take the torch path (the kernel gives the factors theirs only).
    """
    if _whole_table(left, right, ids):
        return full_table_bags(left, right, ids, lengths, weights, mean=mean)
    if not fused_kernels_apply(left) or (weights is not None and weights.requires_grad):
        return bags_reference(left, right, ids, lengths, weights, mean=mean)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    weights = weights.to(left.dtype).contiguous() if weights is not None else None
    return _bags_op(left.contiguous(), right.contiguous(), ids.contiguous(), offsets, weights, mean)
