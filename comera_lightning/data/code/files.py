"""Readers of a code corpus: source files under folders (the Python stdlib by default) and CodeSearchNet JSONL.

Each document is a :class:`CodeDocument`: a key (a relative path, which decides its split) and its text.
"""

from __future__ import annotations

import io
import os
import sysconfig
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from comera_lightning.data.errors import empty_file_error
from comera_lightning.data.jsonl import json_objects

__all__ = [
    "ALWAYS_EXCLUDED_DIRS",
    "CODE_FIELDS",
    "TEST_DIR_NAMES",
    "CodeDocument",
    "list_source_files",
    "read_code_jsonl",
    "read_source_documents",
    "read_source_file",
    "stdlib_dir",
]

TEST_DIR_NAMES = frozenset({"test", "tests", "idle_test"})
ALWAYS_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
CODE_FIELDS = ("code", "original_string")


@dataclass(frozen=True)
class CodeDocument:
    """One document of the corpus: `key` (a relative path, decides the split) and its text."""

    key: str
    text: str


def stdlib_dir() -> Path:
    """The directory of this interpreter's Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_source_files(
    roots: Sequence[str | os.PathLike[str]], extensions: Sequence[str], exclude_tests: bool = True
) -> list[tuple[str, Path]]:
    """Return `(relative key, path)` of every file under `roots` with one of `extensions`, sorted by key."""
    exts = tuple(e if e.startswith(".") else f".{e}" for e in extensions)
    found: dict[str, Path] = {}
    for root in map(Path, roots):
        root = root.expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"source directory {str(root)!r} does not exist or is not a directory")
        for dirpath, dirnames, filenames in os.walk(root):
            # Prune in place so os.walk never descends into excluded folders.
            dirnames[:] = sorted(d for d in dirnames if not _excluded_dir(d, exclude_tests))
            for name in filenames:
                if name.endswith(exts):
                    path = Path(dirpath) / name
                    key = path.relative_to(root).as_posix()
                    found.setdefault(key if len(roots) == 1 else f"{root.name}/{key}", path)
    return sorted(found.items())


def _excluded_dir(name: str, exclude_tests: bool) -> bool:
    return name in ALWAYS_EXCLUDED_DIRS or (exclude_tests and name in TEST_DIR_NAMES)


def read_source_file(path: Path) -> str:
    """Decode a source file: UTF-8 (BOM allowed), or a Python file's PEP 263 coding cookie; raises if it cannot."""
    data = path.read_bytes()
    if path.suffix == ".py":
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    return data.decode("utf-8-sig")


def read_code_jsonl(path: str | os.PathLike[str], max_docs: int | None = None) -> list[CodeDocument]:
    """Read CodeSearchNet-style JSONL (plain or `.gz`), one record per line with a `code` or `original_string`."""
    file = Path(path).expanduser()
    docs = [_code_record(record, file, lineno) for lineno, record in islice(json_objects(file), max_docs)]
    if not docs and (max_docs is None or max_docs > 0):
        raise empty_file_error(file, "one JSON object per line with a `code` or `original_string` field")
    return docs


def _code_record(record: dict, file: Path, lineno: int) -> CodeDocument:
    code = next((record[k] for k in CODE_FIELDS if isinstance(record.get(k), str)), None)
    if code is None:
        raise ValueError(f"{file}: line {lineno}: no string field `code` or `original_string` "
                         f"(keys: {', '.join(sorted(record)[:10])})")
    # Functions of one source file share its path, so they land in the same split.
    if isinstance(record.get("path"), str):
        key = f"{record.get('repo', '')}/{record['path']}"
    else:
        key = f"{file.name}:{lineno}"
    return CodeDocument(key, code)


def read_source_documents(
    files: Sequence[tuple[str, Path]],
    order_key: Callable[[str], float],
    max_files: int | None = None,
    max_bytes: int | None = None,
) -> tuple[list[CodeDocument], list[str]]:
    """Read `(key, path)` files in `order_key(key)` order, up to `max_files` files and `max_bytes` bytes.

    Returns the documents and the files that could not be read or decoded, as ``"path (ErrorName)"``.
    """
    docs: list[CodeDocument] = []
    skipped: list[str] = []
    total = 0
    for key, path in sorted(files, key=lambda kv: order_key(kv[0])):
        if max_files is not None and len(docs) >= max_files:
            break
        try:
            size = path.stat().st_size
            if max_bytes is not None and total + size > max_bytes:
                continue
            text = read_source_file(path)
        except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as err:
            skipped.append(f"{path} ({type(err).__name__})")
            continue
        total += size
        docs.append(CodeDocument(key, text))
    return docs, skipped
