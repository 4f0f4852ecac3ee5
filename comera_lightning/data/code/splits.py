"""Which split a code-corpus document belongs to: a stable hash of its key (a relative path).

A file never straddles splits, and the assignment is the same on every run and machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from comera_lightning.data.code.files import CodeDocument
from comera_lightning.data.splits import SPLITS

__all__ = ["split_documents", "split_of", "unit_hash"]


def unit_hash(key: str, salt: str) -> float:
    """A deterministic number in [0, 1) for a key (stable across runs and machines, unlike `hash`)."""
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


_unit_hash = unit_hash  # the old private name


def split_of(key: str, val_fraction: float, test_fraction: float, seed: int = 0) -> str:
    """The split ('train', 'val' or 'test') a document key belongs to."""
    u = unit_hash(key, f"split{seed}")
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def split_documents(
    docs: Sequence[CodeDocument], val_fraction: float, test_fraction: float, seed: int = 0
) -> dict[str, list[CodeDocument]]:
    """Split documents by the hash of their keys; a split left empty borrows one training document."""
    parts: dict[str, list[CodeDocument]] = {name: [] for name in SPLITS}
    for doc in docs:
        parts[split_of(doc.key, val_fraction, test_fraction, seed)].append(doc)
    # Tiny corpora (max_files=10) could leave val or test empty; give each one document.
    for name, fraction in (("val", val_fraction), ("test", test_fraction)):
        if fraction > 0 and not parts[name] and len(parts["train"]) > 1:
            parts[name].append(parts["train"].pop())
    return parts
