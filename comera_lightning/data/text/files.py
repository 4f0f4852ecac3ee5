"""Text files for language-model pre-training: which files (``text_files``), which are held out (``held_out``),
and the documents each holds (``read_documents``).

Formats, by name: JSON lines (``.jsonl``, ``.json``; C4's ``c4-train.*.json.gz``), one document per line in a
string field (``text``); plain text (``.txt``), one document per file. Any of them may be gzip-compressed (``.gz``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from comera_lightning.data.errors import empty_file_error, utf8_error
from comera_lightning.data.jsonl import json_objects, opener_of

__all__ = ["JSON_LINES_SUFFIXES", "PLAIN_TEXT_SUFFIXES", "held_out", "read_documents", "text_files"]

JSON_LINES_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
PLAIN_TEXT_SUFFIXES = (".txt", ".txt.gz")
_SUFFIXES = JSON_LINES_SUFFIXES + PLAIN_TEXT_SUFFIXES


def text_files(entries: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The files named by ``entries`` (files, folders or glob patterns), sorted and without repeats.

    A folder gives its files with a known suffix; a pattern or folder that gives none, or a file of another
    format, is a ValueError naming it.
    """
    found: dict[Path, None] = {}
    for entry in map(str, entries):
        path = Path(entry).expanduser()
        if path.is_dir():
            matches = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))
        elif path.is_file():
            matches = [path]
        else:
            matches = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
        if not matches:
            raise ValueError(f"{entry!r} names no text file: expected a file, a folder or a glob pattern of "
                             f"files ending in {', '.join(_SUFFIXES)}")
        found.update(dict.fromkeys(matches))
    unknown = [str(p) for p in found if not p.name.endswith(_SUFFIXES)]
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown text format; name the file *.jsonl or *.json (JSON lines with a text "
                         "field) or *.txt (plain text), optionally gzip-compressed (*.gz)")
    return sorted(found)


def held_out(train: list[Path], val: list[Path] | None) -> tuple[list[Path], list[Path]]:
    """(training files, validation files): ``val`` when given (and not among ``train``), else the last training file."""
    if val:
        overlap = sorted(set(train) & set(val))
        if overlap:
            raise ValueError(f"{overlap[0]} is both a training and a validation file; hold validation files out")
        return train, val
    if len(train) < 2:
        raise ValueError(f"one text file ({train[0] if train else 'none'}) cannot be both trained on and held out: "
                         "give two or more files (the last one validates) or validation files of their own")
    return train[:-1], train[-1:]


def read_documents(paths: Iterable[Path], text_field: str = "text") -> Iterator[str]:
    """The documents of ``paths`` in order: each JSON line's ``text_field``, or each plain-text file whole."""
    for path in paths:
        if path.name.endswith(PLAIN_TEXT_SUFFIXES):
            yield _plain_text(path)
            continue
        count = 0
        for lineno, record in json_objects(path):
            text = record.get(text_field)
            if not isinstance(text, str):
                raise ValueError(f"{path}: line {lineno}: no string field {text_field!r} (keys: "
                                 f"{', '.join(sorted(record)[:10])}); pass the field that holds the text")
            count += 1
            yield text
        if not count:
            raise empty_file_error(path, f"one JSON object per line with a string field {text_field!r}")


def _plain_text(path: Path) -> str:
    opener = opener_of(path)
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as err:
        raise utf8_error(path, err, opener) from err
    except (OSError, EOFError) as err:  # a corrupt gzip stream
        raise ValueError(f"{path}: cannot read ({err}); expected UTF-8 text") from err
    if not text.strip():
        raise empty_file_error(path, "UTF-8 text")
    return text
