"""How CAME factors a parameter's statistics, and the rank-1 math its two update paths share (docs/METHOD.md §4)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["Layout", "compute_dtype", "factor_layout", "matrix_dims", "rank1_rsqrt", "stacked", "state_layout"]

# (n_batch, split): dims [0, n_batch) are a batch, [n_batch, split) the rows, [split, ndim) the
# columns of the matrix whose second moment is factored. ``None``: full (unfactored) moments.
Layout = tuple[int, int]


def factor_layout(shape: Sequence[int], min_factor_size: int = 0, factor_core_unfolding: bool = False) -> Layout | None:
    """How CAME factors the statistics of a parameter of ``shape`` (``None``: kept full)."""
    ndim = len(shape)
    if ndim < 2 or math.prod(shape) < min_factor_size:
        return None
    if factor_core_unfolding and ndim in (3, 4):
        return (0, 1)  # TT core (r_left, n, [m,] r_right): rows r_left, columns the rest
    return (ndim - 2, ndim - 1)


def state_layout(state: dict[str, Any], ndim: int) -> Layout | None:
    """The layout an existing CAME state was built with, read off its tensor shapes."""
    if "exp_avg_sq_row" not in state:
        return None
    split = state["exp_avg_sq_row"].dim()
    return (state["exp_avg_sq_col"].dim() - (ndim - split), split)


def matrix_dims(shape: Sequence[int], layout: Layout) -> tuple[int, int, int]:
    """``(B, R, C)``: batch, row and column sizes of ``shape`` under ``layout``."""
    n_batch, split = layout
    return math.prod(shape[:n_batch]), math.prod(shape[n_batch:split]), math.prod(shape[split:])


def compute_dtype(param: Tensor) -> torch.dtype:
    """The dtype of the state and math for ``param``: fp32 for half precision, else its own."""
    return torch.float32 if param.dtype in (torch.float16, torch.bfloat16) else param.dtype


def rank1_rsqrt(row: Tensor, col: Tensor, out: Tensor) -> Tensor:
    """rsqrt of the rank-1 estimate ``row_i col_j / mean(row)`` for (N, R) rows and (N, C) columns, into ``out``."""
    # ``out`` is a spent (N, R, C) buffer: one full-size temporary per step, not three
    r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    c_factor = col.rsqrt().unsqueeze(-2)
    return torch.mul(r_factor, c_factor, out=out)


def stacked(tensors: list[Tensor]) -> Tensor:
    """A read-only stacked copy of ``tensors``; a single tensor is just viewed (callers never write into it)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)
