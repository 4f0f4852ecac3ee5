"""Which rank indices of a bond are live: the mask rule, and a gate whose gradient stops where it is dead.

The rule (docs/METHOD.md §2): an index is live while its ``alive`` flag holds and its gate is not at or below the
threshold (a NaN gate stays live: a numerical fault must show in the outputs, not be pruned away); unless rank 0 is
allowed, each bond's strongest live gate stays live whatever its value. ``TTModule`` latches the rule's masks into its
``alive`` buffers; ``GateBank`` applies the same rule to all bonds at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["grad_masked", "rule_masks", "strongest"]


def strongest(alive: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The live index of the largest gate as a one-hot mask (all False when nothing is live), on device."""
    if alive.numel() == 0:
        return alive
    index = torch.where(alive, gate.detach().abs(), -1.0).argmax().reshape(1)
    return torch.zeros_like(alive).scatter(0, index, alive.gather(0, index))


def rule_masks(alive: Sequence[torch.Tensor], gates: Sequence[torch.Tensor], threshold: float,
               allow_rank0: bool) -> list[torch.Tensor]:
    """Each bond's live mask by the rule, from its ``alive`` flags and its gate."""
    masks = [a & ~(gate <= threshold) for a, gate in zip(alive, gates)]
    if allow_rank0:
        return masks
    return [mask | strongest(a, gate) for mask, a, gate in zip(masks, alive, gates)]


class _GradMasked(torch.autograd.Function):
    """``value`` itself forward (no kernel); in backward its gradient times ``mask``."""

    @staticmethod
    def forward(ctx: object, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mask)
        return value.view_as(value)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def grad_masked(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``value`` whose gradient is zero where ``mask`` is False: a latched gate (dead ones already at zero) needs no
    mask forward, but a dead gate still gets no gradient."""
    return _GradMasked.apply(value, mask)
