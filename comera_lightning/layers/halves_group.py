"""TT linear layers of one layout contract their halves together, once a step: a handful of batched kernels for all.

A train of ``K`` cores costs ``K - 2`` matmuls and ``K - 2`` gate scalings to contract into the two halves a forward
applies (and about three times as many kernels backward), whatever its size: the paper's layout (3 + 3 cores on each
of 36 projections) spends most of a step's kernels there. Layers whose cores have the same shapes (a model's blocks
repeat them: every query projection, every FFN input) are stacked and contracted as one batched chain when the first
of them asks for its halves in a step; the others take their slice. ``group_halves(layers)`` sets a group on every
multi-core ``TTLinear`` among ``layers``; ``TTLinear`` asks it while training with autograd on, eagerly, with its masks
latched, and otherwise contracts its own halves as before.

A step's halves are kept until their gradient has been computed (a hook on the stacked halves), or until a core, gate
or mask of a member changes (their versions are compared, as ``TTModule.masks_latched`` does): a second forward of the
same step (gradient accumulation after a backward, a second call of a layer) gets fresh halves when it needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from comera_lightning.layers.contraction import contract_chain

__all__ = ["HalvesGroup", "group_halves"]


def _layout(layer: Any) -> tuple:
    return tuple(tuple(core.shape) for core in layer.cores), layer.cores[0].dtype, layer.cores[0].device


def _state(layer: Any, split: int) -> tuple:
    """What a layer's halves depend on, read on the host: the cut, autograd and autocast, each tensor's identity and version."""
    tensors = (*layer.cores, *layer.gates, *layer._alive_masks())
    return (split, torch.is_grad_enabled(), torch.is_autocast_enabled(tensors[0].device.type),
            *((id(t), t._version) for t in tensors))


class HalvesGroup:
    """Multi-core TT linear layers whose halves are contracted together, those of one core layout at a time."""

    def __init__(self, layers: Sequence[Any]) -> None:
        self.layers = list(layers)
        self._cached: dict[int, tuple[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def halves(self, layer: Any, split: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``layer.halves(split, gate_apart=True)``, contracted with every member of its layout; None when ``layer`` is
        not a member, or a member of its layout has masks not latched (the layer contracts its own halves then)."""
        state = _state(layer, split)
        entry = self._cached.get(id(layer))
        if entry is None or entry[0] != state:
            layout = _layout(layer)
            members = [m for m in self.layers if _layout(m) == layout and
                       (id(m) not in self._cached or self._cached[id(m)][0] != _state(m, split))]
            if not any(m is layer for m in members) or not all(m.masks_latched() for m in members):
                return None
            self._contract(members, split)
            entry = self._cached[id(layer)]
        return entry[1]

    def _contract(self, members: list[Any], split: int) -> None:
        """Every member's halves at ``split``, through one stacked chain (``contract_chain`` with a batch dimension)."""
        cores = [torch.stack(column) for column in zip(*(list(m.cores) for m in members))]
        gates = [torch.stack(column) for column in zip(*(m.bond_scales() for m in members))]  # latched: masked gradients
        folded = [core * gate.to(core.dtype)[:, None, None, :] if k != split - 1 else core
                  for k, (core, gate) in enumerate(zip(cores, gates))] + cores[len(gates):]
        left, right = contract_chain(folded[:split]), contract_chain(folded[split:])
        ids = [id(m) for m in members]
        if left.requires_grad:  # the step's halves are used: the next forward contracts afresh
            left.register_hook(lambda grad: self._forget(ids))
        for m, l, r, g in zip(members, left.unbind(0), right.unbind(0), gates[split - 1].unbind(0)):
            self._cached[id(m)] = (_state(m, split), (l, r, g.to(l.dtype)))

    def _forget(self, ids: list[int]) -> None:
        for key in ids:
            self._cached.pop(key, None)


def group_halves(layers: Sequence[Any]) -> list[HalvesGroup]:
    """Group the multi-core ``TTLinear`` layers among ``layers`` (two or more of a layout): each gets its group."""
    from comera_lightning.layers.tt_linear import TTLinear

    candidates = [layer for layer in layers if isinstance(layer, TTLinear) and len(layer.cores) > 2]
    by_layout: dict[tuple, list[Any]] = {}
    for layer in candidates:
        by_layout.setdefault(_layout(layer), []).append(layer)
    group = HalvesGroup([m for members in by_layout.values() if len(members) > 1 for m in members])
    for layer in group.layers:
        layer.__dict__["_halves_group"] = group
    return [group] if group.layers else []
