"""Optimizer set-up shared by the bundled LightningModules: the paper's param groups, injectable callables."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule

from comera_lightning.param_groups import comera_param_groups

__all__ = ["paper_adamw", "check_scheduler_interval", "configure_comera_optimizers"]


def paper_adamw(params: Any) -> torch.optim.Optimizer:
    """The paper's optimizer: AdamW with weight decay 0 (learning rates come from the param groups)."""
    return torch.optim.AdamW(params, weight_decay=0.0)


def check_scheduler_interval(interval: str) -> None:
    """Reject a ``scheduler_interval`` other than ``"step"`` or ``"epoch"``."""
    if interval not in ("step", "epoch"):
        raise ValueError(f"scheduler_interval must be 'step' or 'epoch', got {interval!r}.")


def configure_comera_optimizers(module: LightningModule, optimizer: Any, scheduler: Any | None, interval: str | None = None) -> Any:
    """``configure_optimizers`` body: the optimizer callable on the cores/gates/other groups, plus a scheduler.

    Reads ``lr_cores``, ``lr_gates``, ``lr_other``, ``weight_decay``, ``core_weight_decay`` (if
    the module has it) and (unless ``interval`` is given) ``scheduler_interval`` from
    ``module.hparams``. Called from ``configure_optimizers``, i.e. after ``tensorize`` made the cores.
    """
    hp = module.hparams
    groups = comera_param_groups(
        module, lr_cores=hp.lr_cores, lr_gates=hp.lr_gates, lr_other=hp.lr_other,
        weight_decay=hp.weight_decay, core_weight_decay=hp.get("core_weight_decay"),
    )
    built = optimizer(groups)
    if scheduler is None:
        return built
    lr_scheduler = scheduler(built)
    config: dict[str, Any] = {"scheduler": lr_scheduler, "interval": interval or hp.scheduler_interval}
    if isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        config.update(monitor="val/loss", interval="epoch")
    return {"optimizer": built, "lr_scheduler": config}
