"""CoreStepScale: each tensor-train core moves ``scale`` times as far per step as its optimizer moved it.

Why: a weight stored as a product of cores changes by the sum of each core's step multiplied by
the other cores, and those other cores are small (a two-core train at rank r with a dense layer's
entry scale σ holds entries of about σ/√r and √σ). Under an Adam-like optimizer every entry moves
about ``lr`` whatever its scale, so the product moves several times less per step than the dense
weight it replaced would at the same ``lr``: measured on the quality race (docs/TUNING.md), the
tensorized model trained at the user's ``lr`` is held back by that, not by its size. Scaling the
cores' steps gives them the step a dense weight would have, and leaves every other parameter, the
optimizer, its param groups and its LR schedule as the user made them.

How: a pre-step hook copies the cores, a post-step hook adds ``(scale - 1)`` times the step the
optimizer made; an optimizer step that did not run (a skipped AMP step) changes nothing. Only
Adam-like optimizers (``normalises_steps``) are followed; the copies cost one more set of
core-sized tensors at step time.
Plain torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from comera_lightning._checks import check_number

__all__ = ["DEFAULT_CORE_STEP_SCALE", "CoreStepScale", "normalises_steps"]

#: Chosen on the quality race across three models (docs/TUNING.md, "Core step scale with today's layout"):
#: 4 → 5.969 / 6.158 / 5.893, 6 → 5.977 / 6.089 / 5.932, 8 → 5.931 / 6.081 / 6.026 (Llama 128, GPT-2 128, Llama 192).
DEFAULT_CORE_STEP_SCALE = 6.0


#: Optimizers that move each entry by about ``lr`` whatever its gradient's size: the case the scale corrects.
PER_ENTRY_STEPS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax,
                   torch.optim.Adagrad, torch.optim.RMSprop)


def normalises_steps(optimizer: torch.optim.Optimizer) -> bool:
    """True for Adam-like optimizers (those above, and any with ``betas``, e.g. CAME); False for SGD and the rest.

    Under SGD a core's gradient already carries the other cores' size, so its step needs no stretching (a
    stretched SGD step diverged in tests/callback/test_drop_in.py).
    """
    return isinstance(optimizer, PER_ENTRY_STEPS) or "betas" in optimizer.defaults


class CoreStepScale:
    """Multiply the step every Adam-like optimizer makes on the TT cores by ``scale`` (1: leave steps alone)."""

    def __init__(self, scale: float = DEFAULT_CORE_STEP_SCALE) -> None:
        check_number("core_step_scale", scale, 0.0, low_open=True)
        self.scale = float(scale)
        self._layers: list[nn.Module] = []
        self._hooks: list[Any] = []
        self._before: list[torch.Tensor] = []
        self._moving: list[torch.Tensor] = []

    def attach(self, layers: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Scale the steps each of ``optimizers`` makes on the ``cores`` of these TT ``layers`` (read at every step: pruning replaces them)."""
        self.detach()
        if self.scale == 1.0 or not layers:
            return
        self._layers = list(layers)
        for optimizer in [o for o in optimizers if normalises_steps(o)]:
            self._hooks.append(optimizer.register_step_pre_hook(self._remember))
            self._hooks.append(optimizer.register_step_post_hook(self._stretch))

    def detach(self) -> None:
        """Stop scaling steps."""
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._before, self._moving, self._layers = [], [], [], []

    @torch.no_grad()
    def _remember(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # Every core, held by this optimizer or not: one it does not step has a zero step, which stays zero.
        self._moving = [core.detach() for layer in self._layers for core in layer.cores]
        self._before = [core.clone() for core in self._moving]

    @torch.no_grad()
    def _stretch(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._moving:
            return
        torch._foreach_sub_(self._before, self._moving)  # minus the step taken, in the copies' memory
        torch._foreach_add_(self._moving, self._before, alpha=1.0 - self.scale)
        self._before, self._moving = [], []
