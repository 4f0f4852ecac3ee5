"""CutWatch: the budget's late stage watches the training loss between its cuts (docs/METHOD.md §2.3, "The watch").

A validation may come once an epoch, after every cut of the late stage has happened; the training loss comes every
step. On the device, with no host read, the watch keeps (in place, so a captured CUDA graph replays it):

* the training loss's sum, sum of squares and count since the last prune (the window);
* its level, an exponential moving average over about ``1 / (1 - smoothing)`` steps (bias-corrected, as Adam's moments).

At a prune it reads them once. The reference is the level at the first prune after the switch, lowered whenever a
later level is lower (a level, not a window: a few batches of easy text must not set the bar). The cut goes ahead
unless the window's mean is above the reference by more than ``tolerance``, beyond two standard errors of the window's
own noise; a held cut is tried again at the next prune, which cuts to what the schedule asks by then.

Each rank watches its own batches; the callback averages the window over ranks before deciding.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from comera_lightning._checks import check_number

__all__ = ["CutWatch", "WindowStats"]

#: How many standard errors of the window's mean a rise must exceed: the window is a few noisy batches.
NOISE_MARGIN = 2.0


class WindowStats(tuple):
    """(mean, standard error of the mean, level) of a window, read at a prune."""

    mean = property(lambda self: self[0])
    error = property(lambda self: self[1])
    level = property(lambda self: self[2])


class CutWatch:
    """The training loss since the last cut against its level before the cuts: whether the next cut may go ahead."""

    def __init__(self, tolerance: float = 0.02, smoothing: float = 0.98) -> None:
        check_number("loss_tolerance", tolerance, 0.0)
        check_number("smoothing", smoothing, 0.0, 1.0, high_open=True)
        self.tolerance, self.smoothing = float(tolerance), float(smoothing)
        self.best: float | None = None  # the reference level
        self._state: torch.Tensor | None = None  # sum, sum of squares, count, level's numerator, level's weight
        self._update: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # _update_constants, on the device

    def observe(self, loss: torch.Tensor) -> None:
        """Add this step's detached task loss (a few in-place kernels, no host read)."""
        loss = loss.detach().float()
        if self._state is None:
            self._state = torch.zeros(5, device=loss.device)
        elif self._state.device != loss.device:  # restored from a checkpoint (CPU), or moved
            self._state = self._state.to(loss.device)
        if self._update is None or self._update[0].device != loss.device:
            self._update = self._update_constants(loss.device)
        powers, decay, gain = self._update
        # state ← state·decay + gain·(L, L², 1, L, 1): three kernels a step
        self._state.mul_(decay).addcmul_(torch.pow(loss, powers), gain)

    def _update_constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per entry of the state: the power of the loss it adds, its decay and the weight of what it adds."""
        s = self.smoothing
        return (torch.tensor([1.0, 2.0, 0.0, 1.0, 0.0], device=device), torch.tensor([1.0, 1.0, 1.0, s, s], device=device),
                torch.tensor([1.0, 1.0, 1.0, 1 - s, 1 - s], device=device))

    def window(self) -> WindowStats | None:
        """The window's mean, its standard error and the level (one host read); None before two steps were watched."""
        if self._state is None:
            return None
        total, squares, count, numerator, weight = self._state.tolist()
        if count < 2 or weight <= 0:
            return None
        mean = total / count
        variance = max(0.0, squares / count - mean * mean) * count / (count - 1)
        return WindowStats((mean, math.sqrt(variance / count), numerator / weight))

    def allows(self, stats: WindowStats | None) -> bool:
        """Whether a cut may go ahead after a window with ``stats`` (the window then starts afresh)."""
        if self._state is not None:
            self._state[:3].zero_()
        if stats is None:
            return True
        self.best = stats.level if self.best is None else self.best
        if stats.mean - NOISE_MARGIN * stats.error > self.best * (1 + self.tolerance):
            return False
        self.best = min(self.best, stats.level)
        return True

    def reset(self) -> None:
        """At the stage switch: no reference yet, an empty window (the level runs on)."""
        self.best = None
        if self._state is not None:
            self._state[:3].zero_()

    def state_dict(self) -> dict[str, Any]:
        """The reference (the same on every rank) and this rank's running sums, as plain numbers."""
        return {"best": self.best, "state": None if self._state is None else self._state.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; the sums move to the loss's device at the next step."""
        self.best = state["best"]
        self._state = None if state["state"] is None else torch.tensor(state["state"], dtype=torch.float32)
