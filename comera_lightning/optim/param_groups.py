"""The paper's three optimizer parameter groups: TT cores, rank gates, everything else (docs/METHOD.md §2)."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["comera_param_groups", "param_group_of"]


def param_group_of(name: str) -> str:
    """Group of a parameter from its qualified name: ``"gates"``, ``"cores"`` or ``"other"``."""
    parts = name.split(".")
    if "gates" in parts:
        return "gates"
    if "cores" in parts:
        return "cores"
    return "other"


def comera_param_groups(
    module: nn.Module,
    *,
    lr_cores: float = 1e-4,
    lr_gates: float | None = 1e-3,
    lr_other: float = 5e-5,
    weight_decay: float = 0.0,
    core_weight_decay: float | None = None,
) -> list[dict[str, Any]]:
    """Split ``module``'s trainable parameters into named ``cores``/``gates``/``other`` optimizer groups.

    ``lr_gates=None`` leaves the rank gates out: under ``ComeraCallback`` they have their own
    optimizer (``gate_lr``), which takes them out of any group anyway.

    A parameter belongs to ``gates`` when a component of its dotted name is ``gates``, else to
    ``cores`` when one is ``cores``, else to ``other``. Each group sets its own ``lr`` and
    ``weight_decay`` (these override the optimizer's own defaults); gates never get weight decay,
    since decay would shrink them toward the pruning threshold regardless of the task. Empty
    groups are left out; frozen parameters are skipped; shared parameters appear once.

    ``core_weight_decay`` (default: ``weight_decay``) sets the cores' decay on its own: decoupled
    decay shrinks each of a layer's d cores, so the weight they multiply into decays about d
    times faster than a dense weight would at the same setting.
    """
    for key, value in (("lr_cores", lr_cores), ("lr_gates", lr_gates), ("lr_other", lr_other)):
        if value is not None and not value > 0:
            raise ValueError(f"{key} must be a positive learning rate, got {value!r}.")
    if core_weight_decay is None:
        core_weight_decay = weight_decay
    for key, value in (("weight_decay", weight_decay), ("core_weight_decay", core_weight_decay)):
        if value < 0:
            raise ValueError(f"{key} must be >= 0, got {value!r}.")

    settings = {
        "cores": {"lr": lr_cores, "weight_decay": core_weight_decay},
        "gates": {"lr": lr_gates, "weight_decay": 0.0},
        "other": {"lr": lr_other, "weight_decay": weight_decay},
    }
    params: dict[str, list[nn.Parameter]] = {group: [] for group in settings}
    for name, param in module.named_parameters():
        group = param_group_of(name)
        if param.requires_grad and not (group == "gates" and lr_gates is None):
            params[group].append(param)
    return [
        {"name": group, "params": params[group], **settings[group]} for group in settings if params[group]
    ]
