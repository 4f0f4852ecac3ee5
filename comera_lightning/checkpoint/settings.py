"""Arguments given now versus those of the checkpoint being resumed (docs/DESIGN_FLOW.md "Checkpoints and resume").

Precedence: a checkpoint carries *progress* (stage, L₀ and S₀, prune count, ranks, weights, the
gates' Adam moments); the *settings* (schedule lengths, weights of the objective, ``gate_lr``,
``tensorize`` options other than the layers' shapes) are the ones given now. When they differ
from the checkpoint's, one warning names each difference, so a changed config is never silent.
The layers' shapes always come from the checkpoint (its weights); a checkpoint whose tensorized
layers or mode factorisations differ from the model's fails at load time.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["callback_settings", "warn_changed_settings"]


def callback_settings(callback: Any) -> dict[str, Any]:
    """The ComeraCallback arguments that shape training from now on (not its progress): the budget's options by name."""
    return {**callback.budget_config.to_dict(), "core_step_scale": callback.core_steps.scale,
            "tensorize": callback.tensorize_config.to_dict()}


def warn_changed_settings(saved: Mapping[str, Any] | None, now: Mapping[str, Any]) -> list[str]:
    """Warn once about every setting given now that differs from the checkpoint's; returns the differences."""
    if not saved:
        return []
    changes = []
    for key, value in now.items():
        if key == "tensorize":
            changes += [f"tensorize.{k}: checkpoint {saved[key].get(k)!r}, now {v!r}"
                        for k, v in value.items() if k in saved.get(key, {}) and saved[key][k] != v]
        elif key in saved and saved[key] != value:
            changes.append(f"{key}: checkpoint {saved[key]!r}, now {value!r}")
    if changes:
        warnings.warn(
            "ComeraCallback resumes with settings that differ from the checkpoint's: " + "; ".join(changes) + ". "
            "The settings given now are used from here on; the checkpoint's progress (stage, targets, ranks, weights) "
            "is kept. To continue exactly as before, give the checkpoint's values.",
            UserWarning,
            stacklevel=2,
        )
    return changes
