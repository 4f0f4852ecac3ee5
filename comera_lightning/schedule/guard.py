"""QualityGuard: the guarded late stage's brakes on compression (docs/METHOD.md §2.1).

The paper's late stage trades quality for size by design (the task loss weighted 0.1, L₀ fixed
at the switch). The guarded late stage instead trains on ``L + λ·R`` and lets the size term act
only while quality holds:

* per step, on device: ``λ = 1`` while the running mean of the training loss is within
  ``tolerance`` of its best since the switch (and the size is still above S₀), else 0;
* per validation, on the host: a validation loss worse than the best since the switch by more
  than ``tolerance`` pauses the size term until a validation is back within it.

The running mean is rank-local (each rank's own batches); the validation loss is the same on
every rank (it is averaged over ranks before it gets here).
"""

from __future__ import annotations

from typing import Any

import torch

from comera_lightning._checks import check_number

__all__ = ["QualityGuard"]


class QualityGuard:
    """Decides when the guarded late stage may shrink ranks: running training loss and validation loss both hold."""

    def __init__(self, tolerance: float = 0.02, smoothing: float = 0.98) -> None:
        check_number("loss_tolerance", tolerance, 0.0)
        check_number("smoothing", smoothing, 0.0, 1.0, high_open=True)
        self.tolerance, self.smoothing = float(tolerance), float(smoothing)
        self.best_validation: float | None = None
        self.started = False  # after the switch: validations are compared from then on
        self.paused = False
        self.loss_average: torch.Tensor | None = None  # rank-local running mean of the task loss
        self.loss_best: torch.Tensor | None = None
        self._allowed: torch.Tensor | None = None  # 1.0 or 0.0 on device, rewritten in place (CUDA graphs)

    def start(self, validation_loss: float | None) -> None:
        """At the stage switch: the validation loss there is the first best (None when no validation ran before the
        switch: the first one after it is, since a training loss is no reference for it); running means start afresh."""
        self.best_validation = None if validation_loss is None else float(validation_loss)
        self.started, self.paused = True, False
        self.loss_average = self.loss_best = None

    def after_validation(self, loss: float) -> str | None:
        """Pause or resume the size term on this validation loss; returns what changed, in words, or None."""
        if not self.started:
            return None
        if self.best_validation is None:
            self.best_validation = float(loss)
            return None
        best_before, was_paused = self.best_validation, self.paused
        self.best_validation = min(best_before, float(loss))
        self.paused = loss > self.best_validation * (1 + self.tolerance)
        if self._allowed is not None:
            self._allowed.fill_(0.0 if self.paused else 1.0)
        if self.paused and not was_paused:
            return (f"validation loss {loss:.4f} is worse than the late stage's best {self.best_validation:.4f} "
                    f"by more than loss_tolerance={self.tolerance}: rank shrinking paused")
        if was_paused and not self.paused:
            return f"validation loss {loss:.4f} is back within loss_tolerance of {self.best_validation:.4f}: rank shrinking resumes"
        return None

    def pressure(self, loss: torch.Tensor) -> torch.Tensor:
        """λ for this step's detached task loss (0 or 1, on its device; no host sync)."""
        if self.loss_average is None:  # the first step after the switch: the loss is its own best
            self.loss_average, self.loss_best = loss.detach().clone(), loss.detach().clone()
        else:
            if self.loss_average.device != loss.device:  # restored from a checkpoint (CPU), or moved
                self.loss_average, self.loss_best = self.loss_average.to(loss.device), self.loss_best.to(loss.device)
            self.loss_average.mul_(self.smoothing).add_(loss, alpha=1 - self.smoothing)
            torch.minimum(self.loss_best, self.loss_average, out=self.loss_best)
        if self._allowed is None or self._allowed.device != loss.device:
            self._allowed = torch.full((), 0.0 if self.paused else 1.0, device=loss.device, dtype=loss.dtype)
        holds = (self.loss_average <= self.loss_best * (1 + self.tolerance)).to(loss.dtype)
        return holds * self._allowed

    def state_dict(self) -> dict[str, Any]:
        """The best validation loss, whether paused, and the running means (on CPU)."""
        def cpu(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().cpu().clone()

        return {"best_validation": self.best_validation, "started": self.started, "paused": self.paused,
                "loss_average": cpu(self.loss_average), "loss_best": cpu(self.loss_best)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; the running means move to the loss's device at the next step."""
        self.best_validation, self.paused = state["best_validation"], bool(state["paused"])
        self.started = bool(state.get("started", self.best_validation is not None))  # checkpoints before "started"
        self.loss_average, self.loss_best = (None if t is None else t.clone() for t in (state["loss_average"], state["loss_best"]))
        self._allowed = None
