"""The per-parameter CAME update: the readable reference (``foreach=False``) the multi-tensor path matches."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from comera_lightning.optim.came_layout import matrix_dims, rank1_rsqrt, state_layout

__all__ = ["step_single"]


def step_single(group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
    """One CAME step of parameter ``p`` with hyper-parameters ``group`` and its (initialized) ``state``."""
    beta1, beta2, beta3 = group["betas"]
    eps1, eps2 = group["eps"]
    exp_avg = state["exp_avg"]
    g = p.grad.to(exp_avg.dtype).contiguous()
    state["step"].add_(1)
    layout = state_layout(state, p.dim())

    if layout is None:
        exp_avg_sq = state["exp_avg_sq"]
        sq = torch.mul(g, g).add_(eps1)
        exp_avg_sq.mul_(beta2).add_(sq, alpha=1 - beta2)
        u = torch.rsqrt(exp_avg_sq, out=sq).mul_(g)
    else:
        B, R, C = matrix_dims(p.shape, layout)
        g = g.view(B, R, C)
        exp_avg = exp_avg.view(B, R, C)
        sq = torch.mul(g, g).add_(eps1)
        row, col = state["exp_avg_sq_row"].view(B, R), state["exp_avg_sq_col"].view(B, C)
        row.mul_(beta2).add_(sq.mean(dim=-1), alpha=1 - beta2)
        col.mul_(beta2).add_(sq.mean(dim=-2), alpha=1 - beta2)
        u = rank1_rsqrt(row, col, out=sq).mul_(g)

    divisor = torch.linalg.vector_norm(u).div_(math.sqrt(u.numel())).div_(group["clip_threshold"])
    u.div_(divisor.clamp_(min=1.0))
    exp_avg.mul_(beta1).add_(u, alpha=1 - beta1)

    if layout is None and "exp_avg_res" not in state:  # 1-D: no confidence term
        update = exp_avg.mul(group["lr"])
    else:
        res = u.sub_(exp_avg).square_().add_(eps2)  # u is spent: reuse its memory
        if layout is None:
            exp_avg_res = state["exp_avg_res"]
            exp_avg_res.mul_(beta3).add_(res, alpha=1 - beta3)
            update = torch.rsqrt(exp_avg_res, out=res).mul_(exp_avg)
        else:
            row, col = state["exp_avg_res_row"].view(B, R), state["exp_avg_res_col"].view(B, C)
            row.mul_(beta3).add_(res.mean(dim=-1), alpha=1 - beta3)
            col.mul_(beta3).add_(res.mean(dim=-2), alpha=1 - beta3)
            update = rank1_rsqrt(row, col, out=res).mul_(exp_avg)
        update.mul_(group["lr"])

    target = p if p.dtype == exp_avg.dtype else p.to(exp_avg.dtype)
    if group["weight_decay"] != 0:
        target.mul_(1 - group["lr"] * group["weight_decay"])
    target.sub_(update.view(p.shape))
    if target is not p:
        p.copy_(target)
