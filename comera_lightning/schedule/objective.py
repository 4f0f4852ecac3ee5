"""ComeraObjective: the loss each CoMERA stage trains on (docs/METHOD.md §2).

* early stage: ``L + γ·R``;
* late stage, ``"guarded"`` (the default): ``L + λ·R`` with ``λ = 1`` only while quality holds and
  ``S > S₀`` (``guard.py``: the running training loss and the validation loss near their best);
* late stage, ``"paper"``: ``ρ_L·L + ρ_R·R + λ·R + (1−λ)·L`` with ``λ = 1[(L−L₀)/L < (S−S₀)/S]``, on device;
* late stage, ``"budget"``: ``L``; the ranks shrink at each prune to ``target_size`` (``shrink_to_``), not by a loss term,
  while the training loss between prunes holds (``cut_watch.py``);
* final stage: ``L``.

``L`` is the task loss, ``R`` the size surrogate of the gates (``rank.size_surrogate``), ``S``
the exact active size and ``S₀ = target_ratio · S`` at the switch. Plain torch, no Lightning:
it works on a list of TT layers, and each call leaves its terms in ``last`` for logging (the same
tensors every call, written in place, so that a captured CUDA graph keeps them current).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from comera_lightning._checks import check_number
from comera_lightning.layers import TTModule
from comera_lightning.layers.gate_bank import GateBank
from comera_lightning.rank import SURROGATES, active_size, size_surrogate, size_surrogates, surrogate_normalizer
from comera_lightning.schedule.cut_watch import CutWatch
from comera_lightning.schedule.guard import QualityGuard

__all__ = ["LATE_OBJECTIVES", "ComeraObjective"]

#: The late stage's objectives: a size budget on a schedule (``budget``), quality first (``guarded``) or the paper's
#: trade-off (``paper``).
LATE_OBJECTIVES = ("budget", "guarded", "paper")

_STATE = ("size_at_switch", "size_target", "size_asked", "loss_target", "normalizer")


class ComeraObjective:
    """The stage's objective for a task loss; ``enter_late`` fixes S, S₀ and L₀ at the switch."""

    def __init__(
        self,
        target_ratio: float = 0.2,
        rank_weight: float = 0.01,
        loss_weight: float = 0.1,
        size_weight: float = 0.01,
        surrogate: str = "mean",
        late: str = "guarded",
        loss_tolerance: float = 0.02,
        end_size: Callable[[float], float] | None = None,
    ) -> None:
        check_number("target_ratio", target_ratio, 0.0, 1.0, low_open=True)
        check_number("rank_weight", rank_weight, 0.0)
        check_number("loss_weight", loss_weight, 0.0)
        check_number("size_weight", size_weight, 0.0)
        if surrogate not in SURROGATES:
            raise ValueError(f"size_surrogate={surrogate!r} is unknown; choose one of {SURROGATES}.")
        if late not in LATE_OBJECTIVES:
            raise ValueError(f"late_objective={late!r} is unknown; choose one of {LATE_OBJECTIVES}.")
        self.late, self.guard, self.watch = late, QualityGuard(loss_tolerance), CutWatch(loss_tolerance)
        self.end_size = end_size or self._ratio_of_switch_size  # S₀ from the size at the switch (picklable: ddp_spawn)
        self.target_ratio, self.rank_weight = float(target_ratio), float(rank_weight)
        self.loss_weight, self.size_weight, self.surrogate = float(loss_weight), float(size_weight), surrogate
        self.size_at_switch: float | None = None
        self.size_target: float | None = None
        self.size_asked: float | None = None
        self.loss_target: float | None = None
        self.normalizer: float | None = None
        self.layers: list[TTModule] = []
        self.bank = GateBank([])  # the layers' gates in bulk: the size terms in a few kernels a step
        self.last: dict[str, torch.Tensor] = {}
        self._kept: dict[str, torch.Tensor] = {}

    def _ratio_of_switch_size(self, size: float) -> float:
        return self.target_ratio * size

    def bind(self, layers: Sequence[TTModule]) -> None:
        """Work on these TT layers; the surrogate's denominator is fixed the first time (pruning must not make R jump)."""
        self.layers = list(layers)
        self.bank = GateBank(self.layers)
        self.bank.attach()
        if self.normalizer is None:
            self.normalizer = surrogate_normalizer(self.layers, self.surrogate)

    def __call__(self, task_loss: torch.Tensor, stage: str) -> torch.Tensor:
        """The objective of ``stage`` for ``task_loss``; its terms (detached) go to ``last``."""
        guarded = stage == "late" and self.late == "guarded"
        if guarded:  # each bond's strongest rank is spared in the size term: it never cuts a layer off
            surrogate, spared = size_surrogates(self.bank, self.surrogate, self.normalizer)
        else:
            surrogate = size_surrogate(self.bank, self.surrogate, self.normalizer)
        loss = task_loss.detach().float()
        self.last = self._keep(task_loss=loss, size_surrogate=surrogate)
        if self.late == "budget" and stage != "final":
            self.watch.observe(loss)  # the training loss between cuts: a cut that hurts holds the next one
        if stage == "early":
            return task_loss + self.rank_weight * surrogate
        if stage == "final" or self.late == "budget":
            return task_loss
        size = active_size(self.bank).clamp_min(1.0)  # a model pruned to nothing must not divide by zero
        if guarded:
            lam = self.guard.pressure(loss) * (size > self.size_target).to(loss.dtype)
            self.last.update(self._keep(lam=lam, active_size=size))
            return task_loss + lam * spared
        lam = ((loss - self.loss_target) / loss < (size - self.size_target) / size).to(loss.dtype)
        self.last.update(self._keep(lam=lam, active_size=size))
        return self.loss_weight * task_loss + self.size_weight * surrogate + lam * surrogate + (1 - lam) * task_loss

    def _keep(self, **terms: torch.Tensor) -> dict[str, torch.Tensor]:
        """``terms`` copied into tensors kept across calls: a CUDA graph's replays rewrite them, the logs read them."""
        for name, value in terms.items():
            kept = self._kept.get(name)
            if kept is None or (kept.shape, kept.dtype, kept.device) != (value.shape, value.dtype, value.device):
                kept = self._kept[name] = torch.empty_like(value, requires_grad=False)
            kept.copy_(value.detach())
        return {name: self._kept[name] for name in terms}

    def enter_late(self, loss_target: float, validation_loss: float | None = None) -> None:
        """Fix S (the active size now), S₀ (``end_size(S)``: target_ratio·S unless a budget says otherwise) and L₀; the
        guard compares later validations with ``validation_loss`` (None: with the first of them)."""
        self.size_at_switch = float(active_size(self.bank))
        self.size_asked = float(self.end_size(self.size_at_switch))  # above S when the layers started smaller than asked
        self.size_target = min(self.size_at_switch, self.size_asked)
        self.loss_target = float(loss_target)
        self.guard.start(validation_loss)
        self.watch.reset()

    def target_size(self, progress: float) -> float:
        """The budget's size at ``progress`` through the late stage's prunes (0: the switch, 1: the last):
        cubic from S down to S₀ (AdaLoRA's schedule: most of the cut early, while there is time to recover)."""
        remaining = (1.0 - min(1.0, max(0.0, progress))) ** 3
        return self.size_target + (self.size_at_switch - self.size_target) * remaining

    def describe(self) -> str:
        """The late stage's targets in words."""
        if self.late == "budget":
            return (f"S={self.size_at_switch:,.0f} → S₀={self.size_target:,.0f} by the last prune, least important ranks "
                    f"first, while the loss stays within {self.guard.tolerance:.0%} of its best")
        return (
            f"S={self.size_at_switch:,.0f} → target S₀={self.size_target:,.0f} (ratio {self.target_ratio}), "
            f"L₀={self.loss_target:.4f}"
            + (f"; guarded: ranks shrink while the loss stays within {self.guard.tolerance:.0%} of its best"
               if self.late == "guarded" else "")
        )

    def state_dict(self) -> dict[str, Any]:
        """Targets, the surrogate's denominator and the guard's state."""
        return {**{key: getattr(self, key) for key in _STATE}, "guard": self.guard.state_dict(),
                "watch": self.watch.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; unknown keys are an error."""
        unknown = set(state) - {*_STATE, "guard", "watch"}
        if unknown:
            raise KeyError(f"ComeraObjective state has unknown keys {sorted(unknown)}; expected {[*_STATE, 'guard', 'watch']}.")
        for key, value in state.items():  # a checkpoint from before the watch has none: it starts afresh
            if key == "guard":
                self.guard.load_state_dict(value)
            elif key == "watch":
                self.watch.load_state_dict(value)
            else:
                setattr(self, key, value)
