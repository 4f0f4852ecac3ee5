"""Keep a parameter's optimizer state in step with the parameter: sliced after it was sliced (rank pruning,
docs/METHOD.md §2), carried through a change of basis along one axis (a bond re-expressed before a cut).

Elementwise state (AdamW's ``exp_avg``/``exp_avg_sq``/``max_exp_avg_sq``, SGD's
``momentum_buffer``, CAME's ``exp_avg`` and its full statistics) is sliced like the parameter.
Scalars such as ``step`` are left alone.

Factored statistics (CAME's ``exp_avg_{sq,res}_{row,col}``, ``torch.optim.Adafactor``'s
``row_var``/``col_var``) describe the rank-1 estimate ``v_ij = r_i c_j / mean(r)``. Slicing a
batch dim slices both factors. Slicing the row dim slices ``r`` and rescales ``c`` by
``mean(r_kept) / mean(r)``; slicing the column dim slices ``c`` and rescales ``r`` by
``mean(c_kept) / mean(c)``. Either way the estimate of every kept entry is unchanged, and the
factor that averages over the sliced dim becomes its average over the kept positions (exactly so
when the removed positions had zero gradient, as dead rank gates give), so training continues as
if the parameter had had its new shape all along.

When this cannot be done (a state tensor of unknown shape, a CAME parameter whose factoring
would change at the new shape, an empty result), the parameter's state is reset to a fresh one.

A change of basis ``new = old ×_dim T`` turns the loss's gradient into ``g ×_dim T⁻ᵀ``: first moments
(``exp_avg``, ``momentum_buffer``) follow exactly (an L2 term that an optimizer folds into the gradient maps by ``T``
instead: AdamW's decoupled decay is not in its moments); second moments (``exp_avg_sq``, ``max_exp_avg_sq``) as if
the coordinates mixed were uncorrelated, ``v ×_dim (T⁻ᵀ)∘²``. Any other optimizer's state of the parameter (CAME's,
Adafactor's, keys not known here) restarts whole.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from comera_lightning.optim.came import CAME
from comera_lightning.optim.came_layout import factor_layout, state_layout

__all__ = ["rotate_optimizer_state_", "slice_optimizer_state_"]

FIRST_MOMENTS = ("exp_avg", "momentum_buffer")
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")


def slice_optimizer_state_(optimizer: torch.optim.Optimizer, param: Tensor, dim: int, index: Tensor) -> None:
    """Slice ``param``'s optimizer state (and grad) along ``dim`` to ``index``, after ``param.data`` was."""
    if not any(p is param for group in optimizer.param_groups for p in group["params"]):
        raise ValueError(
            f"The parameter of shape {tuple(param.shape)} is not in this {type(optimizer).__name__}; "
            "pass a parameter of one of its param_groups."
        )
    if not -param.dim() <= dim < param.dim():
        raise ValueError(
            f"dim must be in [{-param.dim()}, {param.dim()}) for a parameter of shape {tuple(param.shape)}, got {dim}."
        )
    dim %= param.dim()
    if index.dim() != 1 or index.numel() != param.shape[dim]:
        raise ValueError(
            f"index must be 1-D with one entry per kept position (param.shape[{dim}] = {param.shape[dim]}), "
            f"got shape {tuple(index.shape)}; slice param.data first, then its state."
        )
    index = index.to(device=param.device, dtype=torch.long)
    if param.grad is not None and param.grad.shape != param.shape:
        param.grad = param.grad.index_select(dim, index.to(param.grad.device))

    state = optimizer.state.get(param)
    if not state:
        return
    if isinstance(optimizer, CAME):
        sliced = _slice_came(optimizer, param, state, dim, index)
    elif "row_var" in state or "col_var" in state:
        sliced = _slice_adafactor(state, dim, index)
    else:
        sliced = _slice_elementwise(state, param, dim, index, skip=())
    if sliced is None:
        _reset(optimizer, param)
    else:
        state.update(sliced)


@torch.no_grad()
def rotate_optimizer_state_(optimizer: torch.optim.Optimizer, param: Tensor, dim: int, matrix: Tensor) -> None:
    """Carry ``param``'s state in ``optimizer`` (if it has any) through ``new = old ×_dim matrix``, in place."""
    state = optimizer.state.get(param)
    if not state:
        return
    tensors = {key: value for key, value in state.items() if not _is_scalar(value)}
    known = FIRST_MOMENTS + SECOND_MOMENTS
    if isinstance(optimizer, CAME) or any(key not in known or value.shape != param.shape for key, value in tensors.items()):
        _reset(optimizer, param)
        return
    inverse_t = torch.linalg.pinv(matrix.double()).T
    for key, value in tensors.items():
        mixing = inverse_t if key in FIRST_MOMENTS else inverse_t.square()
        moved = value.movedim(dim, -1).double() @ mixing.to(value.device)
        value.copy_(moved.movedim(-1, dim))  # in place: a captured graph holds these tensors


def _reset(optimizer: torch.optim.Optimizer, param: Tensor) -> None:
    if isinstance(optimizer, CAME):
        optimizer.init_state_(param)
    else:
        optimizer.state[param].clear()  # torch optimizers rebuild a fresh state on the next step


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, Tensor) or value.dim() == 0


def _slice_elementwise(
    state: dict[str, Any], param: Tensor, dim: int, index: Tensor, skip: tuple[str, ...]
) -> dict[str, Tensor] | None:
    """Slice every param-shaped state tensor; ``None`` if one of another shape is not in ``skip``."""
    sliced = {}
    for key, value in state.items():
        if key in skip or _is_scalar(value):
            continue
        same_elsewhere = value.dim() == param.dim() and all(
            value.shape[d] == param.shape[d] for d in range(param.dim()) if d != dim
        )
        if not same_elsewhere:
            return None
        sliced[key] = value.index_select(dim, index.to(value.device))
    return sliced


def _rescale(factor: Tensor, old_other: Tensor, new_other: Tensor, reduce_dims: list[int], shape: list[int]) -> Tensor:
    # factor * mean(kept other factor) / mean(other factor), the means taken over reduce_dims
    old_mean = old_other.mean(dim=reduce_dims)
    ratio = torch.where(old_mean > 0, new_other.mean(dim=reduce_dims) / old_mean, torch.ones_like(old_mean))
    return factor * ratio.view(shape)


def _slice_factored(
    row: Tensor, col: Tensor, n_batch: int, split: int, ndim: int, dim: int, index: Tensor
) -> tuple[Tensor, Tensor]:
    """Slice rank-1 factors: ``row`` has shape[:split], ``col`` shape[:n_batch] + shape[split:]."""
    if dim < n_batch:
        return row.index_select(dim, index), col.index_select(dim, index)
    batch_shape = list(row.shape[:n_batch])
    if dim < split:
        new_row = row.index_select(dim, index)
        new_col = _rescale(col, row, new_row, list(range(n_batch, split)), batch_shape + [1] * (ndim - split))
        return new_row, new_col
    new_col = col.index_select(n_batch + dim - split, index)
    new_row = _rescale(row, col, new_col, list(range(n_batch, col.dim())), batch_shape + [1] * (split - n_batch))
    return new_row, new_col


def _slice_came(
    optimizer: CAME, param: Tensor, state: dict[str, Any], dim: int, index: Tensor
) -> dict[str, Tensor] | None:
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    layout = state_layout(state, param.dim())
    new_layout = factor_layout(param.shape, group["min_factor_size"], group["factor_core_unfolding"])
    if param.numel() == 0 or layout != new_layout:
        return None  # the factoring decision changes at the new shape: a fresh state, not a reinterpretation
    factor_keys = ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_res_row", "exp_avg_res_col")
    sliced = _slice_elementwise(state, param, dim, index, skip=factor_keys)
    if sliced is None or layout is None:
        return sliced
    for name in ("sq", "res"):
        row, col = state[f"exp_avg_{name}_row"], state[f"exp_avg_{name}_col"]
        new = _slice_factored(row, col, *layout, param.dim(), dim, index.to(row.device))
        sliced[f"exp_avg_{name}_row"], sliced[f"exp_avg_{name}_col"] = new
    return sliced


def _slice_adafactor(state: dict[str, Any], dim: int, index: Tensor) -> dict[str, Tensor] | None:
    # torch.optim.Adafactor keeps row_var (..., R, 1) and col_var (..., 1, C)
    row, col = state["row_var"], state["col_var"]
    ndim = row.dim()
    if row.numel() == 0 or col.numel() == 0 or index.numel() == 0:
        return None
    index = index.to(row.device)
    if dim < ndim - 2:
        return {"row_var": row.index_select(dim, index), "col_var": col.index_select(dim, index)}
    new_row, new_col = _slice_factored(row.squeeze(-1), col.squeeze(-2), ndim - 2, ndim - 1, ndim, dim, index)
    return {"row_var": new_row.unsqueeze(-1), "col_var": new_col.unsqueeze(-2)}
