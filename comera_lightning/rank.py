"""Rank gates in bulk: the size surrogate, the exact size, compression counts, physical pruning.

docs/METHOD.md §2. Everything here works on any ``nn.Module`` holding TT layers and on plain torch
optimizers; nothing knows about Lightning or the callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Union

import torch
from torch import nn

from comera_lightning.layers import PruneRecord, TTModule
from comera_lightning.layers.gate_bank import GateBank, gate_weights
from comera_lightning.optim.gates import GateOptimizer
from comera_lightning.optim.state import rotate_optimizer_state_, slice_optimizer_state_

__all__ = [
    "tt_layers",
    "latch_dead_gates_",
    "gate_weights",
    "size_surrogate",
    "size_surrogates",
    "surrogate_normalizer",
    "active_size",
    "CompressionStats",
    "compression_stats",
    "prune_",
    "PruneSummary",
    "shrink_to_",
    "state_follower",
    "beside_cores",
]

SURROGATES = ("mean", "size")


def tt_layers(module: nn.Module) -> list[tuple[str, TTModule]]:
    """Every TT layer inside ``module`` with its qualified name (each module once)."""
    return [(name, m) for name, m in module.named_modules() if isinstance(m, TTModule)]


Layers = Union[Sequence[TTModule], GateBank]


def _bank(layers: Layers) -> GateBank:
    """A ``GateBank`` of ``layers`` (itself if it is one: keep one for what runs every step, its index tensors stay)."""
    return layers if isinstance(layers, GateBank) else GateBank(layers)


def latch_dead_gates_(module: nn.Module | GateBank) -> None:
    """Every TT layer's gates at or below its threshold dead for good (what eager forward does; a compiled one does
    not), in one pass over all bonds; nothing runs where the masks are latched already."""
    (module if isinstance(module, GateBank) else GateBank([m for _, m in tt_layers(module)])).latch_()


def surrogate_normalizer(layers: Layers, kind: str = "mean") -> float:
    """The denominator of ``size_surrogate`` for the layers as they are now (gate count or total weight)."""
    layers = _bank(layers).layers
    if kind not in SURROGATES:
        raise ValueError(f"size surrogate {kind!r} is unknown; choose one of {SURROGATES}.")
    if kind == "mean":
        return float(sum(g.numel() for layer in layers for g in layer.gates))
    return float(sum(w * g.numel() for layer in layers for w, g in zip(gate_weights(layer), layer.gates)))


def size_surrogate(
    layers: Layers, kind: str = "mean", normalizer: float | None = None, spare_strongest: bool = False
) -> torch.Tensor:
    """Differentiable ℓ1 relaxation ``R`` of the model size (docs/METHOD.md §2), with no host sync.

    ``"mean"``: the reference's mean of the masked gate values over all tensorized layers
    (dead gates count as 0). ``"size"``: each gate weighted by the core parameters it controls.
    ``normalizer`` fixes the denominator (pass the value at the start of training so pruning
    does not make ``R`` jump); by default it is ``surrogate_normalizer`` of the layers now.
    ``spare_strongest``: leave each bond's largest gate out, so ``R`` never pushes a bond to rank 0.
    """
    total, strongest, denominator = _surrogate_sums(layers, kind, normalizer, spare_strongest)
    return (total - strongest if spare_strongest else total) / denominator


def size_surrogates(layers: Layers, kind: str = "mean", normalizer: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``size_surrogate`` without and with ``spare_strongest``, from one pass over the gates."""
    total, strongest, denominator = _surrogate_sums(layers, kind, normalizer, True)
    return total / denominator, (total - strongest) / denominator


def _surrogate_sums(
    layers: Layers, kind: str, normalizer: float | None, strongest: bool
) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """The weighted sum of the live gates, of each bond's largest one (when asked), and the denominator."""
    bank = _bank(layers)
    if not bank.layers:
        raise ValueError("size_surrogate needs at least one TT layer; run tensorize() first.")
    denominator = max(normalizer if normalizer is not None else surrogate_normalizer(bank, kind), 1.0)
    total, top = bank.surrogate_sums(kind, strongest)
    return total, top, denominator


def active_size(layers: Layers) -> torch.Tensor:
    """Exact parameter count of all cores at their active ranks (ℓ0 of the gates), on device."""
    return _bank(layers).active_size()


@dataclass(frozen=True)
class CompressionStats:
    """Parameter counts of a model with TT layers and the dense model it stands for."""

    model_parameters: int
    dense_model_parameters: int
    tt_parameters: int
    dense_tt_parameters: int

    @property
    def model_compression(self) -> float:
        """Whole model: dense parameters over parameters held now."""
        return self.dense_model_parameters / max(1, self.model_parameters)

    @property
    def tt_compression(self) -> float:
        """Tensorized layers: dense parameters over parameters held now."""
        return self.dense_tt_parameters / max(1, self.tt_parameters)


def compression_stats(module: nn.Module) -> CompressionStats:
    """Count parameters now and as they would be with every TT layer dense (no device sync)."""
    layers = [m for _, m in tt_layers(module)]
    total = sum(p.numel() for p in module.parameters())
    tt = sum(m.num_parameters() for m in layers)
    dense_tt = sum(m.dense_parameters() for m in layers)
    return CompressionStats(total, total - tt + dense_tt, tt, dense_tt)


@dataclass(frozen=True)
class PruneSummary:
    """What one ``prune_`` call removed."""

    parameters_before: int
    parameters_after: int
    ranks: dict[str, tuple[int, ...]]

    @property
    def removed(self) -> int:
        """Parameters removed from the model."""
        return self.parameters_before - self.parameters_after


@torch.no_grad()
def prune_(module: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> PruneSummary:
    """Slice dead rank indices out of every TT layer, and the optimizers' state with them.

    Sliced parameters are new ``nn.Parameter`` objects: each optimizer that held the old one
    holds the new one in the same place of its param groups, with its state sliced the same
    way (LR schedulers keep working). Anything else that kept references to the old
    parameters (an EMA copy, a DDP wrapper) must be rebuilt; the callback re-wraps DDP.
    """
    optimizers = list(optimizers)
    before = sum(p.numel() for p in module.parameters())
    ranks = {}

    def follow(record: PruneRecord) -> None:
        for optimizer in optimizers:
            if _swap_parameter(optimizer, record.old, record.param):
                slice_optimizer_state_(optimizer, record.param, record.dim, record.index)

    for name, layer in tt_layers(module):
        layer.prune_(on_slice=follow)
        ranks[name] = layer.physical_ranks
    return PruneSummary(before, sum(p.numel() for p in module.parameters()), ranks)


def _swap_parameter(optimizer: torch.optim.Optimizer, old: nn.Parameter, new: nn.Parameter) -> bool:
    """Put ``new`` where ``old`` was in ``optimizer`` (param group and state); False if absent."""
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"]):
            if p is old:
                group["params"][i] = new
                if old in optimizer.state:
                    optimizer.state[new] = optimizer.state.pop(old)
                return True
    return False


def beside_cores(layers: Sequence[TTModule]) -> int:
    """Parameters the TT layers hold besides their cores (gates, biases): what a size budget counts but ranks do not cut."""
    return sum(layer.num_parameters() - sum(core.numel() for core in layer.cores) for layer in layers)


#: ``on_align(layer, bond, M, N, s)``: a bond was re-expressed in its SVD basis (``TTModule.align_bond_``).
AlignListener = Callable[[TTModule, int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def state_follower(optimizers: Iterable[torch.optim.Optimizer], gates: GateOptimizer | None = None) -> AlignListener:
    """An ``on_align`` for ``shrink_to_``: each optimizer's moments of the bond's two cores follow the change of basis
    (core ``k`` by ``M`` on its last axis, core ``k + 1`` by ``N`` on its first: ``×_0 Nᵀ``); the bond's gates restart
    in ``gates`` with their importance shared by ``s²``."""
    optimizers = list(optimizers)

    def follow(layer: TTModule, bond: int, left_map: torch.Tensor, right_map: torch.Tensor, singular: torch.Tensor) -> None:
        for optimizer in optimizers:
            rotate_optimizer_state_(optimizer, layer.cores[bond], -1, left_map)
            rotate_optimizer_state_(optimizer, layer.cores[bond + 1], 0, right_map.T)
        if gates is not None:
            gates.rebase_(layer.gates[bond], singular.square())

    return follow


@torch.no_grad()
def shrink_to_(layers: Sequence[TTModule], target: float,
               importance: Callable[[nn.Parameter], torch.Tensor | None] = lambda gate: None,
               on_align: AlignListener | None = None) -> int:
    """Cut the live rank indices worth least per parameter until the layers' active size is at most ``target``.

    An index's worth is its ``importance`` (e.g. the gates' smoothed sensitivity |g · ∂L/∂g|; the gate's magnitude
    when None) over the core parameters it holds (``gate_weights``): the whole budget is shared among layers and
    bonds by what each index does for the loss. A bond keeps its last live index unless its layer ``allow_rank0``.
    With ``on_align`` (``BudgetConfig(cut="svd")``), a bond of a layer that is not a vocabulary layer first goes to its
    SVD basis (``TTModule.align_bond_``; ``on_align`` lets state kept elsewhere follow) and loses as many of its
    weakest directions instead: the best truncation of that bond (docs/METHOD.md §2.3, "The cut"). Syncs with the
    device; ``prune_`` then slices the dead indices out. Returns how many indices were cut.
    """
    cuts = _cuts_per_bond(layers, target, importance)
    for (li, k), indices in cuts.items():
        layer = layers[li]
        if on_align is not None and not layer.vocabulary_layer:
            on_align(layer, k, *layer.align_bond_(k))
            live = int(layer.gate_masks()[k].sum())
            indices = range(live - len(indices), live)
        layer.kill_(k, indices)
    return sum(len(v) for v in cuts.values())


def _cuts_per_bond(layers: Sequence[TTModule], target: float,
                   importance: Callable[[nn.Parameter], torch.Tensor | None]) -> dict[tuple[int, int], list[int]]:
    """The indices each (layer, bond) loses: the least worth per parameter first, down to ``target``."""
    size = float(active_size(layers)) if layers else 0.0
    if size <= target:
        return {}
    candidates, live = [], {}
    for li, layer in enumerate(layers):
        for k, (mask, gate, weight) in enumerate(zip(layer.gate_masks(), layer.gates, gate_weights(layer))):
            score = importance(gate)
            score = (gate.detach().abs() if score is None else score).float().cpu()
            indices = mask.nonzero().flatten().tolist()
            live[li, k] = len(indices)
            candidates += [(float(score[j]) / weight, li, k, j, weight) for j in indices]
    cuts: dict[tuple[int, int], list[int]] = {}
    for _, li, k, j, weight in sorted(candidates):
        if size <= target or target - (size - weight) > size - target:
            break  # at the size asked, or this cut would land farther below it than we are above
        if live[li, k] <= 1 and not layers[li].allow_rank0:
            continue
        cuts.setdefault((li, k), []).append(j)
        live[li, k] -= 1
        size -= weight
    return cuts
