"""JSON-lines files, plain and gzip: objects with their line numbers, blank lines skipped, every error naming the line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from comera_lightning.data.jsonl import json_objects


@pytest.mark.parametrize("compress", [False, True])
def test_objects_come_with_their_line_numbers(tmp_path: Path, compress: bool) -> None:
    data = b'{"a": 1}\n\n  \n{"a": 2}\n'
    path = tmp_path / ("rows.jsonl.gz" if compress else "rows.jsonl")
    path.write_bytes(gzip.compress(data) if compress else data)
    assert list(json_objects(path)) == [(1, {"a": 1}), (4, {"a": 2})]


def test_a_line_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"rows\.jsonl: line 2: expected a JSON object, found list"):
        list(json_objects(path))


def test_a_gzip_stream_cut_short_names_the_line_it_reached(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(b'{"a": %d}\n' % i for i in range(2000)))[:-40])
    with pytest.raises(ValueError, match=r"rows\.jsonl\.gz: line \d+: cannot read .*expected UTF-8 JSONL"):
        list(json_objects(path))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"JSONL file '.*nothing\.jsonl' does not exist"):
        list(json_objects(tmp_path / "nothing.jsonl"))
