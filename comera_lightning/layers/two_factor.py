"""``y = x · (A diag(g)) · B + b`` as one autograd step: the GEMMs a gated low-rank map needs, and no more memory.

Autograd over the expression saves the rank intermediate ``t = x A diag(g)`` (tokens × rank) besides ``x``, and runs
a chain of small kernels per factor. ``gated_two_factor`` saves what the dense layer it replaced saves (``x``; the
factors and the gate are parameters or their products, a few hundred KB) and recomputes ``t`` in backward: one more
GEMM of tokens × ``d_in`` × rank, which at the ranks that compress costs less than the activation memory it frees
(in fp32 ``S`` is recomputed too, so nothing weight-sized is kept).

Backward, with ``S = A diag(g)`` recomputed and ``G = ∂L/∂y``: ``∂t = G Bᵀ``, ``∂B = tᵀ G``, ``∂x = ∂t Sᵀ``,
``∂S = xᵀ ∂t``, ``∂A = ∂S diag(g)``, ``∂g = colsum(∂S ⊙ A)``, ``∂b = rowsum(G)``. Under autocast the forward makes
autocast's casts (``x``, ``S``, ``B`` to the low dtype) once and keeps them for backward, as a dense layer keeps its
cast weight: the backward's GEMMs run in the low dtype with no cast and no recomputed ``S``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["gated_two_factor"]


class _GatedTwoFactor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, a: torch.Tensor, gate: torch.Tensor, b: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        device = x.device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        scaled = a * gate
        if low is not None:  # autocast's casts, made once and kept for backward (a dense layer keeps its cast weight too)
            x, scaled, b = (t.to(low) for t in (x, scaled, b))
        ctx.has_bias, ctx.low = bias is not None, low
        ctx.save_for_backward(x, a, gate, b, scaled if low is not None else None)  # fp32: the product is recomputed
        t = x @ scaled
        return torch.addmm(bias, t, b) if bias is not None else t @ b

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, a, gate, b, scaled = ctx.saved_tensors
        need_x, need_a, need_gate, need_b, need_bias = ctx.needs_input_grad
        scaled = a * gate if scaled is None else scaled
        low = grad if ctx.low is None else grad.to(ctx.low)
        grad_t = low @ b.T
        grad_b = (x @ scaled).T @ low if need_b else None
        grad_x = grad_t @ scaled.T if need_x else None
        grad_scaled = x.T @ grad_t if need_a or need_gate else None
        grad_a = grad_scaled * gate if need_a else None
        grad_gate = (grad_scaled * a).sum(0) if need_gate else None
        grad_bias = grad.sum(0) if ctx.has_bias and need_bias else None
        return grad_x, grad_a, grad_gate, grad_b, grad_bias


def gated_two_factor(x: torch.Tensor, a: torch.Tensor, gate: torch.Tensor, b: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (a * gate) @ b + bias`` for ``x`` (tokens, d_in), ``a`` (d_in, r), ``gate`` (r,), ``b`` (r, d_out),
    saving only ``x`` of the activations (the rank intermediate is recomputed in backward)."""
    return _GatedTwoFactor.apply(x, a, gate, b, bias)
