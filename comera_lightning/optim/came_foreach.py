"""CAME's multi-tensor update (``foreach=True``/``None``): the numbers of :mod:`.came_single`, fewer kernel launches."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from comera_lightning.optim.came_layout import Layout, matrix_dims, rank1_rsqrt, stacked, state_layout

__all__ = ["step_foreach"]

# Same-shape tensors below _STACK_BELOW elements (where kernel launches, not memory traffic,
# dominate) are stacked, at most _STACK_NUMEL elements per stack.
_STACK_BELOW = 1 << 16
_STACK_NUMEL = 1 << 22


def step_foreach(states: Mapping[Tensor, dict[str, Any]], group: dict[str, Any], params: list[Tensor]) -> None:
    """One CAME step of ``params`` (states initialized): same-kind tensors bucketed, small same-shape ones stacked."""
    buckets: dict[tuple, list[Tensor]] = defaultdict(list)
    for p in params:
        state = states[p]
        layout = state_layout(state, p.dim())
        if layout is None:
            key = ("full" if "exp_avg_res" in state else "vector", p.device, p.dtype)
        else:
            key = ("factored", p.device, p.dtype, p.shape, layout)
        buckets[key].append(p)
    for key, bucket in buckets.items():
        torch._foreach_add_([states[p]["step"] for p in bucket], 1.0)
        if key[0] != "factored":
            _unfactored(states, group, bucket)
            continue
        numel = bucket[0].numel()
        chunk = _STACK_NUMEL // numel if numel < _STACK_BELOW else 1
        for start in range(0, len(bucket), chunk):
            _factored(states, group, bucket[start : start + chunk], key[4])


def _unfactored(states_of: Mapping[Tensor, dict[str, Any]], group: dict[str, Any], params: list[Tensor]) -> None:
    """Full second moments (and confidence, for 2+ dims) of same-kind tensors, with ``torch._foreach_*``."""
    beta1, beta2, beta3 = group["betas"]
    eps1, eps2 = group["eps"]
    states = [states_of[p] for p in params]
    exp_avgs = [s["exp_avg"] for s in states]
    grads = [p.grad.to(m.dtype).contiguous() for p, m in zip(params, exp_avgs)]
    exp_avg_sqs = [s["exp_avg_sq"] for s in states]

    sq = torch._foreach_mul(grads, grads)
    torch._foreach_add_(sq, eps1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_add_(exp_avg_sqs, sq, alpha=1 - beta2)
    us = sq  # spent: reuse its memory
    torch._foreach_copy_(us, exp_avg_sqs)
    torch._foreach_rsqrt_(us)
    torch._foreach_mul_(us, grads)
    _clip_(us, group["clip_threshold"])
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, us, alpha=1 - beta1)

    if "exp_avg_res" not in states[0]:  # 1-D: no confidence term
        updates = torch._foreach_mul(exp_avgs, group["lr"])
    else:
        res = us
        torch._foreach_sub_(res, exp_avgs)
        torch._foreach_pow_(res, 2.0)
        torch._foreach_add_(res, eps2)
        exp_avg_res = [s["exp_avg_res"] for s in states]
        torch._foreach_mul_(exp_avg_res, beta3)
        torch._foreach_add_(exp_avg_res, res, alpha=1 - beta3)
        updates = res
        torch._foreach_copy_(updates, exp_avg_res)
        torch._foreach_rsqrt_(updates)
        torch._foreach_mul_(updates, exp_avgs)
        torch._foreach_mul_(updates, group["lr"])
    _apply_(group, params, updates)


def _factored(
    states_of: Mapping[Tensor, dict[str, Any]], group: dict[str, Any], params: list[Tensor], layout: Layout
) -> None:
    """Factored statistics of same-shape tensors, stacked into one ``(k·B, R, C)`` batch."""
    beta1, beta2, beta3 = group["betas"]
    eps1, eps2 = group["eps"]
    k, shape = len(params), params[0].shape
    B, R, C = matrix_dims(shape, layout)
    states = [states_of[p] for p in params]
    exp_avgs = [s["exp_avg"] for s in states]
    dtype = exp_avgs[0].dtype
    grads = stacked([p.grad.to(dtype) for p in params]).contiguous().view(k * B, R, C)

    def update_factors(name: str, beta: float, values: Tensor) -> tuple[Tensor, Tensor]:
        rows, cols = [s[f"exp_avg_{name}_row"] for s in states], [s[f"exp_avg_{name}_col"] for s in states]
        torch._foreach_mul_(rows, beta)
        torch._foreach_add_(rows, values.mean(dim=-1).view(k, *rows[0].shape).unbind(0), alpha=1 - beta)
        torch._foreach_mul_(cols, beta)
        torch._foreach_add_(cols, values.mean(dim=-2).view(k, *cols[0].shape).unbind(0), alpha=1 - beta)
        return stacked(rows).view(k * B, R), stacked(cols).view(k * B, C)

    buffer = torch.mul(grads, grads).add_(eps1)
    row, col = update_factors("sq", beta2, buffer)
    us = rank1_rsqrt(row, col, out=buffer).mul_(grads)
    _clip_(list(us.view(k, -1).unbind(0)), group["clip_threshold"])
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, us.view(k, *shape).unbind(0), alpha=1 - beta1)
    exp_avg = stacked(exp_avgs).view(k * B, R, C)
    row, col = update_factors("res", beta3, us.sub_(exp_avg).square_().add_(eps2))
    updates = rank1_rsqrt(row, col, out=us).mul_(exp_avg).mul_(group["lr"])
    _apply_(group, params, list(updates.view(k, *shape).unbind(0)))


def _clip_(us: list[Tensor], clip_threshold: float) -> None:
    """Divide each update by ``max(1, RMS / clip_threshold)``, in place."""
    divisors = torch._foreach_norm(us)
    torch._foreach_div_(divisors, [math.sqrt(u.numel()) for u in us])
    torch._foreach_div_(divisors, clip_threshold)
    torch._foreach_clamp_min_(divisors, 1.0)
    torch._foreach_div_(us, divisors)


def _apply_(group: dict[str, Any], params: list[Tensor], updates: list[Tensor]) -> None:
    """Decoupled weight decay, then ``θ -= update`` (rounded once into half-precision parameters)."""
    dtype = updates[0].dtype
    targets = params if params[0].dtype == dtype else [p.to(dtype) for p in params]
    if group["weight_decay"] != 0:
        torch._foreach_mul_(targets, 1 - group["lr"] * group["weight_decay"])
    torch._foreach_sub_(targets, updates)
    if targets is not params:
        torch._foreach_copy_(params, targets)
