"""LossTarget: the L₀ of the late stage's achievement scalarisation (docs/METHOD.md §2), and where it comes from.

In order of precedence: a fixed ``value``; the metric named ``metric`` (``"train"``: the mean
training loss of the early stage's last epoch, even when a validation loss exists); else the
first validation loss logged under a usual name; else that mean training loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from comera_lightning._checks import check_number

__all__ = ["AUTO_LOSS_METRICS", "TRAIN_LOSS_TARGET", "LossTarget"]

AUTO_LOSS_METRICS = ("val/loss", "val_loss", "validation/loss", "valid/loss")
#: ``metric`` value for the mean task loss of the early stage's last (possibly partial) epoch.
TRAIN_LOSS_TARGET = "train"


class LossTarget:
    """Picks L₀ at the stage switch; keeps the running mean of the epoch's task loss on device."""

    def __init__(self, value: float | None = None, metric: str | None = None) -> None:
        if value is not None:
            check_number("loss_target", value, 0.0)
        if metric is not None and not (isinstance(metric, str) and metric):
            raise ValueError(f"loss_target_metric must be a metric name or None, got {metric!r}.")
        self.value, self.metric = value, metric
        self._sum: torch.Tensor | None = None
        self._count: torch.Tensor | None = None

    @property
    def refreshable(self) -> bool:
        """Whether a validation that ran after a step-based switch may replace L₀."""
        return self.value is None and self.metric != TRAIN_LOSS_TARGET

    def reset_epoch(self, device: torch.device) -> None:
        """Zero the epoch's loss sum and count, in place when they exist (a captured CUDA graph adds into them)."""
        if self._count is not None and self._count.device == device:
            self._sum.zero_()
            self._count.zero_()
        else:
            self._sum, self._count = torch.zeros((), device=device), torch.zeros((), device=device)

    def observe(self, task_loss: torch.Tensor) -> None:
        """Add one step's (detached, float) task loss, in place: no host sync, CUDA-graph safe."""
        if self._sum is None:  # called outside a training epoch
            self.reset_epoch(task_loss.device)
        self._sum.add_(task_loss)
        self._count.add_(1)

    def epoch_mean(self) -> float | None:
        """The mean task loss of the current epoch so far, or None before any step."""
        if self._count is None or not bool(self._count):
            return None
        return float(self._sum / self._count)

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """The epoch's running sum and count so far (a resume mid-epoch continues the same mean)."""
        if self._count is None:
            return {"epoch_sum": None, "epoch_count": None}
        return {"epoch_sum": self._sum.detach().cpu().clone(), "epoch_count": self._count.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor | None], device: torch.device | str = "cpu") -> None:
        """Restore ``state_dict()`` output on ``device``."""
        if state.get("epoch_count") is None:
            self._sum = self._count = None
            return
        self._sum, self._count = state["epoch_sum"].to(device), state["epoch_count"].to(device)

    def check_logged(self, metrics: Mapping[str, Any], when: str) -> None:
        """Fail early (not at the stage switch) when ``metric`` names something that is not logged."""
        if self.value is None and self.metric not in (None, TRAIN_LOSS_TARGET) and self.metric not in metrics:
            raise ValueError(
                f"loss_target_metric={self.metric!r} is not logged ({when}); logged metrics: {sorted(metrics)}. "
                "Use one of these names, or 'train' for the mean training loss."
            )

    def quality(self, metrics: Mapping[str, Any]) -> float:
        """The loss the late stage's guard watches: ``resolve`` without the fixed value (a fixed L₀ is a target, not a
        measurement: the guard compares the validation loss, or the metric named, with its best)."""
        return LossTarget(None, self.metric).resolve(metrics) if self.value is not None else self.resolve(metrics)

    def reference(self, metrics: Mapping[str, Any]) -> float | None:
        """The guard's first best at the switch: a fixed L₀, else the loss it watches as logged now (the metric named,
        ``"train"``: the epoch's mean training loss; else a validation loss under a usual name); None when none is
        logged yet (then the first validation after the switch is)."""
        if self.value is not None:
            return float(self.value)
        if self.metric == TRAIN_LOSS_TARGET:
            return self.epoch_mean()
        names = (self.metric,) if self.metric is not None else AUTO_LOSS_METRICS
        return next((float(metrics[name]) for name in names if name in metrics), None)

    def resolve(self, metrics: Mapping[str, Any]) -> float:
        """L₀ now, given the metrics logged so far (``trainer.callback_metrics``): ``reference``'s, else the epoch's mean
        training loss when no metric was named."""
        found = self.reference(metrics)
        if found is not None:
            return found
        if self.metric == TRAIN_LOSS_TARGET:
            raise ValueError(f"loss_target_metric={TRAIN_LOSS_TARGET!r}: no training step ran in the early stage's last epoch.")
        if self.metric is not None:
            raise ValueError(
                f"loss_target_metric={self.metric!r} was not logged by the end of the early stage; logged metrics: {sorted(metrics)}."
            )
        mean = self.epoch_mean()
        if mean is None:
            raise ValueError("ComeraCallback could not pick a loss target: set loss_target or log a validation loss ('val/loss').")
        return mean
