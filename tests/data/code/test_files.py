"""The code-corpus readers: source folders, the stdlib, CodeSearchNet JSONL (plain and gzip) and their errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from comera_lightning.data.code import CodeCorpusDataModule, read_code_jsonl, stdlib_dir
from tests.helpers.code_files import python_source


@pytest.mark.parametrize("compress", [False, True])
def test_code_jsonl_invalid_utf8_names_the_exact_line(tmp_path: Path, compress: bool) -> None:
    rows = [json.dumps({"code": f"x = {i}  # some padding to fill the decoder's chunks"}).encode() for i in range(500)]
    rows[399] = b'{"code": "s = \'caf\xe9\'"}'
    data = b"".join(row + b"\n" for row in rows)
    path = tmp_path / ("code.jsonl.gz" if compress else "code.jsonl")
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(ValueError, match=r"code\.jsonl(\.gz)?: line 400: not valid UTF-8 \(byte 0xe9.*re-encode"):
        read_code_jsonl(path)


def test_code_jsonl_blank_lines_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "code.jsonl"
    path.write_text('\n{"code": "a = 1"}\n  \n{"code": "b = 2"}\n\n', encoding="utf-8")
    assert [d.text for d in read_code_jsonl(path)] == ["a = 1", "b = 2"]


@pytest.mark.parametrize("text", ["", "\n \n"])
def test_code_jsonl_empty_file_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.jsonl: line 1: the file holds no data lines"):
        read_code_jsonl(path)
    assert read_code_jsonl(path, max_docs=0) == []


def test_stdlib_default_corpus() -> None:
    dm = CodeCorpusDataModule(max_files=12, vocab_size=400)
    docs = [d for split in dm.documents.values() for d in split]
    assert len(docs) == 12
    assert all(d.key.endswith(".py") and "site-packages" not in d.key for d in docs)
    assert all(not set(d.key.split("/")[:-1]) & {"test", "tests", "idle_test"} for d in docs)
    assert (stdlib_dir() / docs[0].key).is_file()


def test_jsonl_source_plain_and_gzip(tmp_path: Path) -> None:
    records = [{"repo": "me/r", "path": f"src/m{i // 2}.py", "func_name": f"f{i}", "code": python_source(i)}
               for i in range(30)]
    plain = tmp_path / "train.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in records[:20]), encoding="utf-8")
    zipped = tmp_path / "more.jsonl.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as handle:
        for r in records[20:]:
            handle.write(json.dumps({"original_string": r["code"]}) + "\n")
    docs = read_code_jsonl(zipped)
    assert len(docs) == 10 and docs[0].key == "more.jsonl.gz:1"

    dm = CodeCorpusDataModule(jsonl_files=[str(plain), str(zipped)], vocab_size=300, block_size=64,
                              batch_size=4, val_fraction=0.2, test_fraction=0.2)
    split = {d.key: name for name, part in dm.documents.items() for d in part}
    assert len([d for part in dm.documents.values() for d in part]) == 30
    assert split.get("me/r/src/m0.py") is not None  # functions of one file share a key, hence a split
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 64)
    assert CodeCorpusDataModule(jsonl_files=[str(plain)], max_files=5).documents is not None
    assert sum(len(v) for v in CodeCorpusDataModule(jsonl_files=[str(plain)], max_files=5).documents.values()) == 5


def test_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"code": "x = 1"}\n{"code": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: invalid JSON"):
        read_code_jsonl(path)
    path.write_text('{"code": "x = 1"}\n{"docstring": "no code"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: no string field `code` or `original_string`"):
        read_code_jsonl(path)
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        read_code_jsonl(tmp_path / "absent.jsonl")
