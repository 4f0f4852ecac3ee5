"""Malformed Criteo, MovieLens atomic and code JSONL files: errors name the file and line; blank lines pass."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from comera_lightning.data.code.files import read_code_jsonl
from comera_lightning.data.criteo.tsv import CriteoIterableDataset
from comera_lightning.data.movielens.files import load_raw, read_atomic_file

SIZES = [1000] * 26


def criteo_line(index: int, c1: str | None = None, i1: str | None = None) -> str:
    ints = [i1 if i1 is not None else str(index)] + [str(k) for k in range(12)]
    cats = [c1 if c1 is not None else f"{index:08x}"] + [f"{(index * 7919 + k) % 2**32:08x}" for k in range(25)]
    return "\t".join(["1", *ints, *cats])


def criteo_batches(path: Path, batch_size: int = 2) -> list:
    return list(CriteoIterableDataset([path], batch_size=batch_size, table_sizes=SIZES))


# ----- Criteo --------------------------------------------------------------------------------------


@pytest.mark.parametrize("hex_id", ["1" + "0" * 16, "f" * 16, "abcdef0123456789abcdef"])
def test_criteo_long_hex_id_is_reduced_like_any_id(tmp_path: Path, hex_id: str) -> None:
    path = tmp_path / "day_0.txt"
    path.write_text("".join(criteo_line(i, c1=hex_id if i == 1 else None) + "\n" for i in range(3)))
    batches = criteo_batches(path)
    ids = [v for b in batches for v in b.sparse["cat_0"].values().tolist()]
    assert ids == [0, int(hex_id, 16) % 1000, 2]


def test_criteo_overlong_integer_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "day_1.txt"
    path.write_text("".join(criteo_line(i, i1="9" * 400 if i == 2 else None) + "\n" for i in range(4)))
    with pytest.raises(ValueError, match=r"day_1\.txt, line 3: integer column I1 holds a 400-character integer"):
        criteo_batches(path)


def test_criteo_huge_integer_that_fits_float64_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "day_2.txt"
    path.write_text("".join(criteo_line(i, i1="9" * 305 if i == 0 else None) + "\n" for i in range(2)))
    (batch,) = criteo_batches(path)
    assert torch.isfinite(batch.dense).all() and batch.dense[0, 0] > 700


@pytest.mark.parametrize("compress", [False, True])
def test_criteo_blank_lines_are_skipped(tmp_path: Path, compress: bool) -> None:
    lines = [criteo_line(i) for i in range(5)]
    clean = tmp_path / "clean.txt"
    clean.write_text("".join(line + "\n" for line in lines))
    blank = tmp_path / ("blank.txt.gz" if compress else "blank.txt")
    text = "\n" + lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n  \r\n\n"
    with (gzip.open(blank, "wt") if compress else open(blank, "w")) as handle:
        handle.write(text)
    expected, got = criteo_batches(clean), criteo_batches(blank)
    assert len(got) == len(expected) == 3
    for a, b in zip(expected, got):
        assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse.values(), b.sparse.values())


def test_criteo_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "day_3.txt"
    path.write_text(criteo_line(0) + "\n\n" + "1\tbad\n")
    with pytest.raises(ValueError, match=r"day_3\.txt, line 3: expected 40 tab-separated columns"):
        criteo_batches(path)


@pytest.mark.parametrize("text", ["", "\n \n"])
def test_criteo_empty_file_is_an_error(tmp_path: Path, text: str) -> None:
    good = tmp_path / "day_0.txt"
    good.write_text(criteo_line(0) + "\n")
    empty = tmp_path / "day_1.txt"
    empty.write_text(text)
    dataset = CriteoIterableDataset([good, empty], batch_size=4, table_sizes=SIZES)
    with pytest.raises(ValueError, match=r"day_1\.txt: line 1: the file holds no data lines"):
        list(dataset)


# ----- MovieLens atomic files ----------------------------------------------------------------------

INTER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
USER = "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token"
ITEM = "item_id:token\trelease_year:token\tclass:token_seq"


def write_movielens(folder: Path, inter_rows: list[str]) -> Path:
    (folder / "ml-100k.inter").write_text("\n".join([INTER, *inter_rows]) + "\n")
    (folder / "ml-100k.user").write_text(f"{USER}\n1\t24\tM\ttechnician\t85711\n")
    (folder / "ml-100k.item").write_text(f"{ITEM}\n5\t1995\tAnimation Comedy\n6\t1995\tDrama\n")
    return folder


def test_movielens_bad_rating_names_file_and_line(tmp_path: Path) -> None:
    write_movielens(tmp_path, ["1\t5\t4\t881250949", "", "1\t6\tfour\t881250950"])
    with pytest.raises(ValueError, match=r"ml-100k\.inter, line 4: column 'rating' holds 'four', not a number"):
        load_raw(tmp_path)


def test_movielens_bad_timestamp_names_file_and_line(tmp_path: Path) -> None:
    write_movielens(tmp_path, ["1\t5\t4\t881250949", "1\t6\t3\tyesterday"])
    with pytest.raises(ValueError, match=r"ml-100k\.inter, line 3: column 'timestamp' holds 'yesterday'"):
        load_raw(tmp_path)


def test_movielens_blank_lines_are_tolerated(tmp_path: Path) -> None:
    write_movielens(tmp_path, ["1\t5\t4\t881250949", "   ", "", "1\t6\t3\t881250950", " "])
    raw = load_raw(tmp_path)
    assert raw.items == ["5", "6"] and raw.ratings == [4.0, 3.0]


def test_movielens_wrong_field_count_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "ml-100k.inter"
    path.write_text(f"{INTER}\n1\t5\t4\t881250949\n1\t5\t4\n")
    with pytest.raises(ValueError, match=r"ml-100k\.inter, line 3: expected 4 tab-separated columns.*got 3"):
        read_atomic_file(path)


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("", 1, "no header"), ("\n\n", 1, "no header"), (f"{INTER}\n\n", 2, "no data rows"),
])
def test_movielens_empty_file_is_an_error(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = tmp_path / "ml-100k.inter"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"ml-100k\.inter, line {line}: {problem}"):
        read_atomic_file(path)


# ----- code JSONL ----------------------------------------------------------------------------------


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
