"""Argument checks shared by the schedule objects and the callback: one message style for bad values."""

from __future__ import annotations

from typing import Any

__all__ = ["check_count", "check_exclusive", "check_number"]


def check_count(name: str, value: Any, minimum: int = 1) -> None:
    """``value`` is None or an int >= ``minimum``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be an integer >= {minimum} or None, got {value!r}.")


def check_number(name: str, value: Any, low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False) -> None:
    """``value`` is a number in the interval from ``low`` to ``high`` (``None``: unbounded)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high is None or high_open else "]"
        raise ValueError(f"{name} must be a number in {left}{low}, {high if high is not None else '∞'}{right}, got {value!r}.")


def check_exclusive(**pairs: tuple[Any, Any]) -> None:
    """Each keyword ``"a|b"`` maps to ``(a, b)``, of which at most one may be set."""
    for names, (first, second) in pairs.items():
        a, b = names.split("|")
        if first is not None and second is not None:
            raise ValueError(f"{a}={first} and {b}={second} conflict: set one of them (or neither).")
