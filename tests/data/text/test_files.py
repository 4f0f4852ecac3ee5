"""Text files: finding them (files, folders, globs), holding one out, reading C4 shards, JSON lines and plain text."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from comera_lightning.data.text import held_out, read_documents, text_files
from tests.data.text.conftest import sentences, write_shard


def test_c4_shards_are_found_sorted_and_read_in_order(c4_dir: Path) -> None:
    files = text_files([str(c4_dir)])
    assert [p.name for p in files] == [f"c4-train.{i:05d}-of-00003.json.gz" for i in range(3)]
    assert text_files([str(c4_dir / "c4-train.*.json.gz")]) == files
    assert list(read_documents(files[:2])) == sentences(0, 30) + sentences(1, 30)


def test_the_last_file_is_held_out_unless_validation_files_are_given(c4_dir: Path, tmp_path: Path) -> None:
    files = text_files([str(c4_dir)])
    assert held_out(files, None) == (files[:2], files[2:])
    val = [write_shard(tmp_path / "c4-validation.00000-of-00001.json.gz", sentences(9, 5))]
    assert held_out(files, val) == (files, val)
    with pytest.raises(ValueError, match=r"both a training and a validation file"):
        held_out(files, files[:1])
    with pytest.raises(ValueError, match=r"cannot be both trained on and held out: give two or more files"):
        held_out(files[:1], None)


def test_a_malformed_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c4-train.00000-of-00001.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write('{"text": "fine"}\n{"text": "also fine"}\n{"text": "cut off\n{"text": "never read"}\n')
    with pytest.raises(ValueError, match=r"c4-train\.00000-of-00001\.json\.gz: line 3: invalid JSON"):
        list(read_documents([path]))


def test_a_record_without_the_text_field_names_its_keys(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "docs.jsonl.gz", ["a", "b"], field="content")
    with pytest.raises(ValueError, match=r"docs\.jsonl\.gz: line 1: no string field 'text' \(keys: content, "
                                         r"timestamp, url\); pass the field"):
        list(read_documents([path]))
    assert list(read_documents([path], text_field="content")) == ["a", "b"]


def test_plain_text_files_are_one_document_each(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first book\n\nwith two paragraphs\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("second book\n")
    files = text_files([str(tmp_path / "*.txt*")])
    assert list(read_documents(files)) == ["first book\n\nwith two paragraphs\n", "second book\n"]


def test_bad_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(ValueError, match=r"latin\.txt: line 2: not valid UTF-8 \(byte 0xe9"):
        list(read_documents([tmp_path / "latin.txt"]))
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.jsonl: line 1: the file holds no data lines.*string field 'text'"):
        list(read_documents([tmp_path / "empty.jsonl"]))
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"broken\.json\.gz: line 1: cannot read"):
        list(read_documents([tmp_path / "broken.json.gz"]))


def test_names_that_give_no_text_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# notes\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"notes\.md: unknown text format; name the file \*\.jsonl"):
        text_files([str(tmp_path / "notes.md")])
    with pytest.raises(ValueError, match=r"'.*c4-train\.\*\.json\.gz' names no text file"):
        text_files([str(tmp_path / "c4-train.*.json.gz")])
    with pytest.raises(ValueError, match=r"names no text file"):
        text_files([str(tmp_path)])  # a folder with no known format
