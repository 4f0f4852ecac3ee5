"""Criteo TSV lines and files for the reader tests."""

from __future__ import annotations

import gzip
from pathlib import Path

SMALL_SIZES = [1000] * 26


def make_line(index: int, label: int = 1, empty: bool = False) -> str:
    """A valid Criteo line whose C1 encodes ``index`` (so a test can tell lines apart)."""
    if empty:
        return "\t".join([str(label)] + [""] * 13 + [""] * 26)
    ints = [str(index), "-1", "", "5"] + [str(k) for k in range(9)]
    cats = [f"{index:08x}", "", "ABCDEF01"] + [f"{(index * 7919 + k) % 2**32:08x}" for k in range(23)]
    return "\t".join([str(label), *ints, *cats])


def write_lines(path: Path, lines: list[str], compress: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines)
    if compress:
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path
