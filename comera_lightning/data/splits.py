"""The split names every data module uses (``"train"``, ``"val"``, ``"test"``) and the one check of split fractions."""

from __future__ import annotations

__all__ = ["SPLITS", "STAGE_SPLITS", "check_split_fractions", "resolve_split"]

SPLITS: tuple[str, ...] = ("train", "val", "test")
#: The splits a Lightning stage (``setup(stage)``) reads.
STAGE_SPLITS: dict[str, tuple[str, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("test",),
}


def resolve_split(split: str) -> str:
    """``split`` itself when it is a split name, else a ValueError naming the valid ones."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(map(repr, SPLITS))}")
    return split


def check_split_fractions(val_fraction: float, test_fraction: float, *, allow_empty: bool = True) -> None:
    """A ValueError unless both fractions are in [0, 1) (``allow_empty=False``: (0, 1)) and leave rows for training."""
    in_range = all((0 <= f if allow_empty else 0 < f) and f < 1 for f in (val_fraction, test_fraction))
    if not (in_range and val_fraction + test_fraction < 1):
        interval = "[0, 1)" if allow_empty else "(0, 1)"
        raise ValueError(f"val_fraction and test_fraction must be in {interval} with a sum below 1, got {val_fraction} and {test_fraction}.")
