"""JSON-lines files, plain or gzip: one JSON object per line, every error naming the file and the line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from comera_lightning.data.errors import utf8_error

__all__ = ["json_objects", "opener_of"]


def opener_of(path: Path) -> Callable[..., IO[Any]]:
    """``gzip.open`` for a ``.gz`` file, ``open`` for anything else."""
    return gzip.open if path.suffix == ".gz" else open


def json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of every non-blank line of a JSON-lines file (``.gz``: gzip-compressed).

    Raises FileNotFoundError for a missing file and ValueError naming the file and the line for invalid UTF-8,
    invalid JSON, a line that is not a JSON object, or a corrupt gzip stream.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"JSONL file {str(file)!r} does not exist")
    opener = opener_of(file)
    with opener(file, "rt", encoding="utf-8") as handle:
        lineno = 0
        try:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    yield lineno, _parse(line, file, lineno)
        except UnicodeDecodeError as err:  # text is decoded by the chunk: find the line in a rescan
            raise utf8_error(file, err, opener) from err
        except (OSError, EOFError) as err:  # a corrupt gzip stream
            raise ValueError(f"{file}: line {lineno + 1}: cannot read ({err}); expected UTF-8 JSONL") from err


def _parse(line: str, file: Path, lineno: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: line {lineno}: invalid JSON ({err.msg} at column {err.colno}); "
                         "expected one JSON object per line") from err
    if not isinstance(record, dict):
        raise ValueError(f"{file}: line {lineno}: expected a JSON object, found {type(record).__name__}")
    return record
