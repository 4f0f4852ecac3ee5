"""The rank gates of many tensor trains seen as one vector: what runs every step costs a few kernels for all of them.

Per bond, the mask rule (``TTModule.gate_masks``) and the size terms cost about ten kernels each; a model has tens to
hundreds of bonds, and on a GPU each kernel costs microseconds whatever its size. ``GateBank`` concatenates the gates
and masks of its layers once per call and does the same maths over all bonds at once (segment reductions for the
per-bond parts), so a step's latch, size surrogate and exact size are each a fixed handful of kernels. Its index
tensors (each entry's bond, threshold and weight) are built when the gates' shapes change (a prune), not every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from comera_lightning.layers.base import TTModule, _listed
from comera_lightning.layers.gate_masks import grad_masked

__all__ = ["GateBank", "gate_weights"]


@dataclass(frozen=True)
class _Plan:
    """Index tensors of one layout of the gates (rebuilt after a prune)."""

    sizes: list[int]
    bond: torch.Tensor  # each entry's bond (segment) number
    position: torch.Tensor  # 0..n-1
    threshold: torch.Tensor  # each entry's layer threshold, in the gates' dtype
    spared: torch.Tensor  # each entry's layer keeps a bond's strongest gate (not allow_rank0)
    any_spared: bool
    bond_weight: torch.Tensor  # each bond's weight in the size-weighted surrogate (``gate_weights``)
    entry_weight: torch.Tensor  # the same for each entry
    left: torch.Tensor  # per core: index of its left bond's count in [1, counts...] (0: a boundary of rank 1)
    right: torch.Tensor
    core_modes: torch.Tensor  # per core: the product of its modes


def gate_weights(layer: TTModule) -> list[int]:
    """Per-bond weight for the size-weighted ℓ1: core parameters one index of that bond controls.

    Index ``j`` of bond ``k`` owns slice ``j`` of the left core's last axis and of the right
    core's first axis: ``numel(G_k)/r_k + numel(G_{k+1})/r_k`` parameters (a plain int, no sync).
    """
    return [math.prod(layer.cores[k].shape[:-1]) + math.prod(layer.cores[k + 1].shape[1:]) for k in range(len(layer.gates))]


class GateBank:
    """The gates of ``layers`` as one vector: the mask latch, the size surrogate's sums and the exact size, in bulk."""

    def __init__(self, layers: Sequence[TTModule]) -> None:
        self.layers = list(layers)
        self._key: tuple | None = None
        self._plan: _Plan | None = None
        self._vector: torch.Tensor | None = None
        self._pieces: dict[int, tuple[tuple, list[torch.Tensor]]] = {}

    def gates(self) -> list[torch.Tensor]:
        """Every bond's gate, layer by layer."""
        return [g for layer in self.layers for g in _listed(layer.gates)]

    def alive(self) -> list[torch.Tensor]:
        """The ``alive`` buffers (what ``latch_`` writes)."""
        return [a for layer in self.layers for a in layer._alive_masks()]

    def masks(self) -> torch.Tensor:
        """Every bond's live mask (``TTModule.gate_masks``: the buffers themselves when latched), as one vector."""
        return torch.cat([m for layer in self.layers for m in layer.gate_masks()])

    def uniform(self) -> bool:
        """Whether the gates share a dtype and a device (else callers go layer by layer)."""
        gates = self.gates()
        return bool(gates) and all((g.dtype, g.device) == (gates[0].dtype, gates[0].device) for g in gates)

    def plan(self) -> _Plan:
        """The index tensors for the gates as they are now (built again when a gate's identity or size changed)."""
        key = tuple((id(g), g.numel(), layer.gate_threshold, layer.allow_rank0) for layer in self.layers for g in _listed(layer.gates))
        if key != self._key:
            self._plan, self._key = self._build_plan(), key
        return self._plan

    def _build_plan(self) -> _Plan:
        gates = self.gates()
        device, dtype = gates[0].device, gates[0].dtype
        sizes = [g.numel() for g in gates]
        per_bond = lambda values, kind: torch.tensor(values, dtype=kind, device=device)  # noqa: E731
        thresholds = [layer.gate_threshold for layer in self.layers for _ in layer.gates]
        spared = [not layer.allow_rank0 for layer in self.layers for _ in layer.gates]
        weights = [w for layer in self.layers for w in gate_weights(layer)]
        left, right, modes, first = [], [], [], 1
        for layer in self.layers:
            cores = len(layer.cores)
            left += [0] + list(range(first, first + cores - 1))
            right += list(range(first, first + cores - 1)) + [0]
            modes += [math.prod(m) for m in layer.core_modes]
            first += cores - 1
        repeats = per_bond(sizes, torch.long)
        expand = lambda values, kind: per_bond(values, kind).repeat_interleave(repeats)  # noqa: E731
        return _Plan(sizes, torch.arange(len(sizes), device=device).repeat_interleave(repeats),
                     torch.arange(sum(sizes), device=device), expand(thresholds, dtype), expand(spared, torch.bool),
                     any(spared), per_bond(weights, torch.float32), expand(weights, torch.float32),
                     per_bond(left, torch.long), per_bond(right, torch.long), per_bond(modes, torch.float32))

    # ------------------------------------------------------------------ the masks
    @torch.no_grad()
    def latch_(self) -> None:
        """Every layer's ``alive`` buffers set to its masks (``TTModule.gate_masks``' rule), in one pass over all bonds;
        nothing runs when every layer is latched already."""
        stale = [layer for layer in self.layers if not layer.masks_latched()]
        if not stale:
            return
        if not self.uniform():
            for layer in stale:
                layer.latch_dead_gates_()
            return
        plan, alive_list = self.plan(), self.alive()
        gates, alive = torch.cat([g.detach() for g in self.gates()]), torch.cat(alive_list)
        live = alive & ~(gates <= plan.threshold)  # NaN stays live
        if plan.any_spared:
            live |= self._strongest(plan, gates, alive) & plan.spared
        torch._foreach_copy_(alive_list, list(live.split(plan.sizes)))
        torch._foreach_mul_(self.gates(), alive_list)  # dead gates at zero: a latched forward needs no mask
        for layer in self.layers:
            layer.note_latched()

    @staticmethod
    def _strongest(plan: _Plan, gates: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """Each bond's first live entry of the largest magnitude (a NaN bond has none: its NaN is live anyway)."""
        bonds = len(plan.sizes)
        score = torch.where(alive, gates.abs(), -1.0)
        top = score.new_full((bonds,), -1.0).scatter_reduce(0, plan.bond, score, "amax")
        at_top = (score == top[plan.bond]) & alive
        first = torch.full((bonds,), len(plan.position), device=gates.device).scatter_reduce(
            0, plan.bond, torch.where(at_top, plan.position, len(plan.position)), "amin")
        return plan.position == first[plan.bond]

    # ------------------------------------------------------------------ the step's gate vector
    def attach(self) -> None:
        """Every layer takes its latched gates from this bank's step vector while training (``layer_scales``)."""
        for layer in self.layers:
            layer.__dict__["_gate_bank"] = self

    def layer_scales(self, layer: TTModule, key: tuple) -> list[torch.Tensor] | None:
        """``layer``'s gates as views of the step vector (``step_vector``), ``key`` its ``_mask_key()``; None where it has none."""
        entry = self._pieces.get(id(layer))
        if entry is None or entry[0] != key:
            if self._build_vector() is None:
                return None
            entry = self._pieces.get(id(layer))
        return entry[1] if entry is not None else None

    def step_vector(self) -> torch.Tensor | None:
        """Every bond's gate for this step as one vector, its gradient masked where dead: one ``cat`` forward and one
        mask backward for all bonds; each layer and the size term take views of it, so each gate gets one gradient
        (not one per use, summed gate by gate). Built again when a gate or mask changed; forgotten once its gradient
        is computed. None unless autograd is on, every layer is latched and the gates share a dtype and device."""
        current = self._vector is not None and all(
            id(layer) in self._pieces and self._pieces[id(layer)][0] == layer._mask_key() for layer in self.layers)
        return self._vector if current else self._build_vector()

    def _build_vector(self) -> torch.Tensor | None:
        if not (torch.is_grad_enabled() and self.uniform() and all(layer.masks_latched() for layer in self.layers)):
            return None
        vector = grad_masked(torch.cat(self.gates()), torch.cat(self.alive()))  # dead gates are zero already
        pieces = iter(vector.split(self.plan().sizes))
        self._pieces = {id(layer): (layer._mask_key(), [next(pieces) for _ in layer.gates]) for layer in self.layers}
        if vector.requires_grad:
            vector.register_hook(self._forget)
        self._vector = vector
        return vector

    def _forget(self, grad: torch.Tensor) -> None:
        self._vector, self._pieces = None, {}

    # ------------------------------------------------------------------ the size terms
    def surrogate_sums(self, kind: str, strongest: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sum of the live gates (``kind`` "size": each weighted by the parameters it controls) and, if asked, of
        each bond's largest live gate (same weights), differentiable, in float32."""
        plan = self.plan()
        vector = self.step_vector()
        live = (vector if vector is not None else torch.cat(self.gates()) * self.masks()).float()
        weighted = kind == "size"
        total = (live * plan.entry_weight if weighted else live).sum()
        if not strongest:
            return total, None
        top = live.new_zeros(len(plan.sizes)).scatter_reduce(0, plan.bond, live, "amax", include_self=False)
        return total, (top * plan.bond_weight if weighted else top).sum()

    def active_size(self) -> torch.Tensor:
        """Exact parameter count of the cores at the live ranks (ℓ0 of the gates), float32 on device, no sync."""
        plan = self.plan()
        alive = self.masks().float()
        counts = torch.cat([alive.new_ones(1), alive.new_zeros(len(plan.sizes)).index_add_(0, plan.bond, alive)])
        return (counts[plan.left] * plan.core_modes * counts[plan.right]).sum()
