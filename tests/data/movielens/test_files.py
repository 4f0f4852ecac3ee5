"""The reader of RecBole's atomic files: malformed MovieLens files name the file and the line; blank lines pass."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.movielens.files import load_raw, read_atomic_file  # noqa: E402

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
