"""The split names every data module uses: ``"train"``, ``"val"``, ``"test"``.

``resolve_split`` still accepts the old name ``"validation"`` (with a ``DeprecationWarning``),
and a :class:`SplitDict` answers ``d["validation"]`` the same way.
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

__all__ = ["DEPRECATED_SPLIT_NAMES", "SPLITS", "STAGE_SPLITS", "SplitDict", "resolve_split"]

SPLITS: tuple[str, ...] = ("train", "val", "test")
#: The splits a Lightning stage (``setup(stage)``) reads.
STAGE_SPLITS: dict[str, tuple[str, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("test",),
}
#: Old split names still accepted, and the name they mean now.
DEPRECATED_SPLIT_NAMES: dict[str, str] = {"validation": "val"}

V = TypeVar("V")


def _warn_renamed(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"the split name {old!r} is deprecated; use {new!r} (splits are {', '.join(map(repr, SPLITS))})",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def resolve_split(split: str, *, stacklevel: int = 2) -> str:
    """``split`` itself, or ``"val"`` for the deprecated ``"validation"`` (warns); ValueError for any other name.

    ``stacklevel`` is the frame the warning points at, counted from the caller of this function
    (2: the caller's caller, the code that passed the old name to a public method).
    """
    new = DEPRECATED_SPLIT_NAMES.get(split)
    if new is not None:
        _warn_renamed(split, new, stacklevel + 1)
        return new
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(map(repr, SPLITS))}")
    return split


class SplitDict(dict[str, V]):
    """A dict keyed by split name; ``d["validation"]`` warns and returns ``d["val"]``."""

    def __missing__(self, key: Any) -> V:
        new = DEPRECATED_SPLIT_NAMES.get(key) if isinstance(key, str) else None
        if new is None or new not in self:
            raise KeyError(key)
        _warn_renamed(key, new, 2)
        return self[new]
