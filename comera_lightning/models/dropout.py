"""Dropout with a cheaper CPU mask: 16-bit random words, a boolean mask, one fused multiply.

``F.dropout`` on CPU draws one ``bernoulli_`` float per element, keeps that float mask for the
backward and multiplies twice; in the paper's Transformer step at batch 32 these draws were the
largest op after the matrix products (profile in ``benchmarks/training/transformer_speed.py``). Here one
64-bit draw of the default generator gives four 16-bit words and an element is kept when its word
falls below ``keep · 2^16``: the keep probability is ``1 - p`` rounded to a multiple of ``2^-16``
and the kept values are scaled by the exact inverse of that probability, so the expected output
equals the input. The mask is saved as ``bool`` (1 byte an element instead of 4). Other devices
use ``F.dropout`` (on CUDA a fused kernel that CUDA graphs can capture), and so does a compiled graph (dynamo cannot
trace the in-place draw: it broke the graph at every dropout).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_WORD_VALUES = 1 << 16


def keep_mask(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> tuple[Tensor, float]:
    """A boolean mask of ``shape`` keeping each element with probability ≈ ``1 - p``, and the scale of kept values."""
    kept_words = max(1, round((1.0 - p) * _WORD_VALUES))
    if kept_words == _WORD_VALUES:  # p below 2^-17: keeps everything (and 2^15 would not fit an int16 compare)
        return torch.ones(shape, dtype=torch.bool, device=device), 1.0
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(-(1 << 63), None)
    mask = words.view(torch.int16)[:count].view(shape) < kept_words - _WORD_VALUES // 2
    return mask, _WORD_VALUES / kept_words


class _MaskAndScale(torch.autograd.Function):
    """``where(mask, x, 0) · scale`` whose backward applies the same mask and scale to the gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.where(mask, x, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, 0.0).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element of ``x`` with probability ``p`` and scale the rest (identity when not training)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():  # (compiled: inductor fuses its own; random_ breaks the graph)
        return F.dropout(x, p, training=True)
    mask, scale = keep_mask(x.shape, p, x.device)
    return _MaskAndScale.apply(x, mask, scale)


class Dropout(nn.Module):
    """``nn.Dropout`` with the cheaper CPU mask of :func:`dropout`."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p!r}.")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Apply dropout while training."""
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
