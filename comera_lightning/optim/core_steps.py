"""CoreStepScale: how far each tensor-train core moves per step, relative to what its optimizer moved it.

The rule (``scale="auto"``, the default; docs/METHOD.md §2.2): the cores indexed by tokens — every core of a
token table, the output cores of a head to a vocabulary (``TTModule.token_cores``) — move
``VOCABULARY_STEP_SCALE`` (12) times as far as the optimizer moved them; every other core (a head's input
cores, every core of the other layers) moves exactly as the optimizer moved it. Why: under an Adam-like
optimizer each entry of a dense table or head moves about ``lr`` whenever its token's gradient is non-zero,
however small, so a rare token's row learns as fast as a frequent one's. A TT table or head shares its cores
among many tokens: a token's own row (or column) moves only through a core scaled by the small entries of the
other cores, several times slower. Linear maps between features have no such per-token rows; their products
learn at the dense layer's pace without help, and so does a head's input core: shared by every token, its step
moves every column at once, by an amount that grows with the head's rank (stretched too, it blew a width-512
model with a 32,000-token head up within 15 steps). Measured on the quality race (docs/TUNING_STEP_RULE.md, "Core
steps"): stretching the vocabulary layers' steps and no others beats one constant for every layer (the
previous default, 6 everywhere: it left a Llama classifier at chance and a byte-level model 8 % behind) and
three rules derived per layer or per core from the cores' norms and steps, at every LR of the sweep.

From trained weights (``init="svd"``: a trained model compressed) to a budget of at most
``TRAINED_MILD_COMPRESSION`` (4x), the token cores start with most of what their rows learned, and ``"auto"`` holds
their stretched LR (the scale times the LR their optimizer group starts at) to ``TRAINED_TOKEN_LR_CAP``, stretching
them no less than ``TRAINED_VOCABULARY_STEP_SCALE`` (4) and no more than 12 times: at LR 3e-3 twelvefold steps pushed
a trained Llama's table off what it knew within the warm-up (its training loss 3.04 -> 3.58 in 11 steps, before any
cut) and 4 did best, while at LR 1e-3 12 did better on both Llamas and at 3e-4 on the CodeBERT-like model. Cut
further (8x starts them 4x smaller, 32x 16x), the rows re-learn as from scratch and 12x did better
(docs/COMPRESS_LM.md, "Token steps from trained weights").

``scale`` a number: every TT layer's cores move that many times as far (1: the optimizer's own steps; the
paper's configs). Only Adam-like optimizers (``normalises_steps``) are followed; under SGD a core's
gradient already carries the other cores' size. The user's optimizer, its param groups, weight decay and
LR schedule stay as they are (the schedule scales the stretched step as it scales every other).

How: a pre-step hook copies the cores of the layers to stretch, a post-step hook adds ``(scale - 1)``
times the step the optimizer made; an optimizer step that did not run (a skipped AMP step) changes
nothing. Layers whose scale is 1 cost nothing. Plain torch, capturable in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Union

import torch
from torch import nn

from comera_lightning._checks import check_number

__all__ = [
    "DEFAULT_CORE_STEP_SCALE",
    "TRAINED_MILD_COMPRESSION",
    "TRAINED_TOKEN_LR_CAP",
    "TRAINED_VOCABULARY_STEP_SCALE",
    "VOCABULARY_STEP_SCALE",
    "CoreStepScale",
    "is_vocabulary_layer",
    "normalises_steps",
]

#: The default rule: the cores indexed by tokens stretched, every other core left alone (module docstring).
DEFAULT_CORE_STEP_SCALE = "auto"
#: How far a vocabulary layer's cores move under ``"auto"``, relative to the optimizer's step. Chosen on the
#: quality race (docs/TUNING_STEP_RULE.md, "Core steps": 3, 6, 12 and 24 at two LRs on two model families).
VOCABULARY_STEP_SCALE = 12.0
#: The same from trained weights to a budget of at most ``TRAINED_MILD_COMPRESSION``: of 1, 2, 4 and 12 at 2x and 4x on
#: two trained Llamas (BPE, bytes), two seeds, 10 % and 25 % extra steps, the one no worse than 12 on average anywhere;
#: at 32x with 10 % extra steps 12 was better on all six runs (docs/COMPRESS_LM.md, "Token steps from trained weights").
TRAINED_VOCABULARY_STEP_SCALE = 4.0
#: The largest budget (times smaller than dense) that takes the trained rule: 2x starts at about the dense size and 4x
#: at 2x, keeping most of each token row; 8x starts the token layers 4x smaller (there 4 against 12 was a wash).
TRAINED_MILD_COMPRESSION = 4.0
#: From trained weights at mild compression, the token cores' stretched LR is held to this (4 x 3e-3): the stretch is
#: this over their group's starting LR, between ``TRAINED_VOCABULARY_STEP_SCALE`` and ``VOCABULARY_STEP_SCALE``. At LR
#: 1e-3 (12x) 12 beat 4 on all eight runs of two trained Llamas, two seeds, 2x and 4x, and on three of four of a
#: trained GPT-2's (docs/COMPRESS_LM.md).
TRAINED_TOKEN_LR_CAP = 0.012

CoreStepScaleArg = Union[float, Literal["auto"]]

#: Optimizers that move each entry by about ``lr`` whatever its gradient's size: the case the scale corrects.
PER_ENTRY_STEPS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax,
                   torch.optim.Adagrad, torch.optim.RMSprop)


def normalises_steps(optimizer: torch.optim.Optimizer) -> bool:
    """True for Adam-like optimizers (those above, and any with ``betas``, e.g. CAME); False for SGD and the rest.

    Under SGD a core's gradient already carries the other cores' size, so its step needs no stretching (a
    stretched SGD step diverged in tests/callback/test_drop_in.py).
    """
    return isinstance(optimizer, PER_ENTRY_STEPS) or "betas" in optimizer.defaults


def is_vocabulary_layer(layer: nn.Module) -> bool:
    """A token table, or an output head to a vocabulary (``tensorize`` marks those it builds)."""
    return bool(getattr(layer, "vocabulary_layer", False))


class CoreStepScale:
    """Stretch the steps every Adam-like optimizer makes on TT cores: by layer kind (``"auto"``) or by one number.

    ``trained_compression``: the layers start from trained weights (``init="svd"``) and the budget ends them this many
    times smaller than dense (None: from scratch); at most ``TRAINED_MILD_COMPRESSION``, ``"auto"`` stretches the token
    cores so that their LR is at most ``TRAINED_TOKEN_LR_CAP`` (from ``TRAINED_VOCABULARY_STEP_SCALE`` to
    ``VOCABULARY_STEP_SCALE`` times), not ``VOCABULARY_STEP_SCALE`` times. A number is the same either way.
    """

    def __init__(self, scale: CoreStepScaleArg = DEFAULT_CORE_STEP_SCALE, trained_compression: float | None = None) -> None:
        if scale != "auto":
            check_number("core_step_scale", scale, 0.0, low_open=True)
            scale = float(scale)
        self.scale: CoreStepScaleArg = scale
        self.trained_compression = trained_compression
        # (scale, the layers with the indices of their cores to stretch, how many cores in all): fixed at attach
        self._groups: list[tuple[float, list[tuple[nn.Module, list[int]]], int]] = []
        self._hooks: list[Any] = []
        self._before: list[torch.Tensor] = []
        self._moving: list[torch.Tensor] = []

    def scale_for(self, layer: nn.Module, lr: float | None = None) -> float:
        """How far ``layer``'s stretched cores (``cores_to_stretch``) move per step, relative to the optimizer's step;
        ``lr``: the LR their optimizer group starts at (None: not known)."""
        if self.scale == "auto":
            if not is_vocabulary_layer(layer):
                return 1.0
            mild = self.trained_compression is not None and self.trained_compression <= TRAINED_MILD_COMPRESSION
            if not mild:
                return VOCABULARY_STEP_SCALE
            capped = TRAINED_TOKEN_LR_CAP / lr if lr else TRAINED_VOCABULARY_STEP_SCALE
            return round(min(VOCABULARY_STEP_SCALE, max(TRAINED_VOCABULARY_STEP_SCALE, capped)), 3)
        return float(self.scale)

    def stretch_of(self, layer: nn.Module) -> float:
        """How far ``layer``'s cores move per step as attached (1 for a layer not stretched)."""
        return next((scale for scale, members, _ in self._groups for member, _ in members if member is layer), 1.0)

    def cores_to_stretch(self, layer: nn.Module) -> list[int]:
        """Indices of ``layer``'s cores whose steps ``scale_for`` stretches: its token cores under ``"auto"``, all of them under a number."""
        return list(layer.token_cores()) if self.scale == "auto" else list(range(len(layer.cores)))

    def attach(self, layers: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Stretch the steps each of ``optimizers`` makes on the ``cores`` of these TT ``layers`` (read at every step: pruning replaces them)."""
        self.detach()
        starting_lr = {id(p): float(group.get("initial_lr", group["lr"])) for optimizer in optimizers
                       if normalises_steps(optimizer) for group in optimizer.param_groups for p in group["params"]}
        by_scale: dict[float, list[tuple[nn.Module, list[int]]]] = {}
        for layer in layers:
            indices = self.cores_to_stretch(layer)
            if indices:  # a layer with nothing to stretch (a two-factor table) costs no step nothing
                lr = max((starting_lr[id(layer.cores[k])] for k in indices if id(layer.cores[k]) in starting_lr), default=None)
                by_scale.setdefault(self.scale_for(layer, lr), []).append((layer, indices))
        counted = [(scale, members, sum(len(indices) for _, indices in members)) for scale, members in by_scale.items()]
        self._groups = [group for group in counted if group[0] != 1.0 and group[2]]
        if not self._groups:
            return
        for optimizer in [o for o in optimizers if normalises_steps(o)]:
            self._hooks.append(optimizer.register_step_pre_hook(self._remember))
            self._hooks.append(optimizer.register_step_post_hook(self._stretch))

    def detach(self) -> None:
        """Stop stretching steps."""
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._before, self._moving, self._groups = [], [], [], []

    def stretched_layers(self) -> list[nn.Module]:
        """The layers whose cores' steps are stretched now."""
        return [layer for _, members, _ in self._groups for layer, _ in members]

    @torch.no_grad()
    def _remember(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # Every core, held by this optimizer or not: one it does not step has a zero step, which stays zero. Read
        # from the layer at every step: pruning replaces the cores.
        self._moving = [layer.cores[k].detach() for _, members, _ in self._groups for layer, indices in members for k in indices]
        self._before = torch._foreach_mul(self._moving, 1.0) if self._moving else []  # copies, in one kernel

    @torch.no_grad()
    def _stretch(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._moving:
            return
        torch._foreach_sub_(self._before, self._moving)  # minus the step taken, in the copies' memory
        start = 0
        for scale, _, count in self._groups:
            end = start + count
            torch._foreach_add_(self._moving[start:end], self._before[start:end], alpha=1.0 - scale)
            start = end
        self._before, self._moving = [], []
