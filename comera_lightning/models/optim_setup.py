"""Optimizer set-up shared by the bundled LightningModules: the paper's param groups, injectable callables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch import LightningModule

from comera_lightning.optim.param_groups import comera_param_groups

__all__ = ["ParamGroupSettings", "paper_adamw", "check_scheduler_interval", "configure_comera_optimizers"]


@dataclass(frozen=True)
class ParamGroupSettings:
    """Learning rates and weight decay of the cores and other groups (see :func:`comera_param_groups`; the gates are ComeraCallback's)."""

    lr_cores: float = 1e-4
    lr_other: float = 5e-5
    weight_decay: float = 0.0
    core_weight_decay: float | None = None


def paper_adamw(params: Any) -> torch.optim.Optimizer:
    """The paper's optimizer: AdamW with weight decay 0 (learning rates come from the param groups)."""
    return torch.optim.AdamW(params, weight_decay=0.0)


def check_scheduler_interval(interval: str) -> None:
    """Reject a ``scheduler_interval`` other than ``"step"`` or ``"epoch"``."""
    if interval not in ("step", "epoch"):
        raise ValueError(f"scheduler_interval must be 'step' or 'epoch', got {interval!r}.")


def configure_comera_optimizers(
    module: LightningModule, optimizer: Any, scheduler: Any | None, settings: ParamGroupSettings, interval: str = "step"
) -> Any:
    """``configure_optimizers`` body: the optimizer callable on ``module``'s param groups, plus a scheduler.

    Called from ``configure_optimizers``, i.e. after ``tensorize`` made the cores.
    """
    groups = comera_param_groups(
        module, lr_cores=settings.lr_cores, lr_gates=None, lr_other=settings.lr_other,
        weight_decay=settings.weight_decay, core_weight_decay=settings.core_weight_decay,
    )
    built = optimizer(groups)
    if scheduler is None:
        return built
    lr_scheduler = scheduler(built)
    config: dict[str, Any] = {"scheduler": lr_scheduler, "interval": interval}
    if isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        config.update(monitor="val/loss", interval="epoch")
    return {"optimizer": built, "lr_scheduler": config}
