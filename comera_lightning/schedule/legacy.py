"""Callback state written before 0.2: one flat dict, mapped onto the schedule objects' own state."""

from __future__ import annotations

from typing import Any

__all__ = ["from_flat_state"]

_FLAT_KEYS = {
    "stage": ("schedule", "stage"), "early_epochs": ("schedule", "early_epochs_resolved"),
    "late_start_epoch": ("schedule", "late_start_epoch"), "late_start_step": ("schedule", "late_start_step"),
    "last_prune_step": ("schedule", "last_prune_step"), "prune_events": ("schedule", "prune_events"),
    "size_at_switch": ("objective", "size_at_switch"), "size_target": ("objective", "size_target"),
    "loss_target_value": ("objective", "loss_target"), "gate_normalizer": ("objective", "normalizer"),
}


def from_flat_state(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"schedule": {...}, "objective": {...}}`` from the flat layout; unknown keys are an error."""
    unknown = set(flat) - set(_FLAT_KEYS)
    if unknown:
        raise KeyError(f"ComeraCallback state has unknown keys {sorted(unknown)}; expected some of {sorted(_FLAT_KEYS)}.")
    state: dict[str, dict[str, Any]] = {"schedule": {}, "objective": {}}
    for key, value in flat.items():
        part, name = _FLAT_KEYS[key]
        state[part][name] = value
    return state
