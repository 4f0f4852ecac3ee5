"""Error messages of the data readers that name the file and the line: invalid UTF-8, empty files."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

__all__ = ["empty_file_error", "find_bad_utf8", "utf8_error"]

_REENCODE_HINT = "re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 IN > OUT`)"


def find_bad_utf8(
    path: str | os.PathLike[str], opener: Callable[..., IO[Any]] = open
) -> tuple[int, int, int] | None:
    """(line number, byte column, byte) of the first byte of ``path`` that is not UTF-8, None if there is none.

    Lines are split on ``\\n``, which never occurs inside a multi-byte UTF-8 character.
    """
    with opener(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return line_no, err.start + 1, raw[err.start]
    return None


def utf8_error(
    path: str | os.PathLike[str], err: UnicodeDecodeError, opener: Callable[..., IO[Any]] = open
) -> ValueError:
    """A ValueError naming the file and the line of the first invalid UTF-8 byte (the slow path: rescans)."""
    found = find_bad_utf8(path, opener)
    if found is None:  # pragma: no cover - the decoder failed, so some line is not UTF-8
        return ValueError(f"{path}: not valid UTF-8 ({err.reason}); {_REENCODE_HINT}")
    line_no, column, byte = found
    return ValueError(
        f"{path}: line {line_no}: not valid UTF-8 (byte 0x{byte:02x} at byte {column} of the line: "
        f"{err.reason}); {_REENCODE_HINT}"
    )


def empty_file_error(path: str | os.PathLike[str], expected: str) -> ValueError:
    """A ValueError for a file with no data lines (empty, blank or header only)."""
    return ValueError(f"{path}: line 1: the file holds no data lines (it is empty or blank); expected {expected}")
