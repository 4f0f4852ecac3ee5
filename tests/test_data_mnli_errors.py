"""Malformed MNLI files (GLUE TSV and MultiNLI JSONL): each error names the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from comera_lightning.data.pairs.mnli import read_mnli_jsonl, read_mnli_tsv

HEADER = "index\tsentence1\tsentence2\tgold_label"


def tsv_row(i: int, label: str = "neutral") -> str:
    return f"{i}\tthe premise number {i}\tthe hypothesis {i}\t{label}"


def jsonl_row(i: int, label: str = "neutral") -> str:
    return json.dumps({"sentence1": f"premise {i}", "sentence2": f"hypothesis {i}", "gold_label": label})


def write_bytes(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


@pytest.mark.parametrize("bad_line", [3, 600])  # 600: well past the first decoded chunk of the file
def test_tsv_invalid_utf8_names_file_line_and_fix(tmp_path: Path, bad_line: int) -> None:
    rows = [tsv_row(i).encode() for i in range(700)]
    rows[bad_line - 2] = f"{bad_line}\tcaf".encode() + b"\xff" + b"\tx\tneutral"
    path = write_bytes(tmp_path / "train.tsv", [HEADER.encode(), *rows])
    with pytest.raises(ValueError, match=rf"train\.tsv: line {bad_line}: not valid UTF-8 \(byte 0xff.*re-encode"):
        read_mnli_tsv(path)


def test_jsonl_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    rows = [jsonl_row(i).encode() for i in range(400)]
    rows[299] = b'{"sentence1": "caf\xe9", "sentence2": "b", "gold_label": "neutral"}'
    path = write_bytes(tmp_path / "multinli_1.0_train.jsonl", rows)
    with pytest.raises(ValueError, match=r"multinli_1\.0_train\.jsonl: line 300: not valid UTF-8 \(byte 0xe9.*UTF-8"):
        read_mnli_jsonl(path)


def test_tsv_extra_tab_in_sentence_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dev_matched.tsv"
    bad = "2\tthe premise\twith a tab\tthe hypothesis\tneutral"
    path.write_text("\n".join([HEADER, tsv_row(1), bad, tsv_row(3)]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev_matched\.tsv: line 3: expected 4 tab-separated fields.*found 5"):
        read_mnli_tsv(path)


def test_tsv_missing_field_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("\n".join([HEADER, tsv_row(1), "2\tonly premise\tneutral"]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.tsv: line 3: expected 4 tab-separated fields.*found 3"):
        read_mnli_tsv(path)


def test_blank_lines_are_tolerated(tmp_path: Path) -> None:
    tsv = tmp_path / "train.tsv"
    tsv.write_text("\n".join([HEADER, tsv_row(1), "", "  ", tsv_row(2), ""]) + "\n", encoding="utf-8")
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("\n".join([jsonl_row(1), "", jsonl_row(2), "   "]) + "\n", encoding="utf-8")
    for split in (read_mnli_tsv(tsv), read_mnli_jsonl(jsonl)):
        assert len(split) == 2 and split.text_a[1].endswith("2")


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_empty_tsv_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "train.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.tsv: line 1: empty file"):
        read_mnli_tsv(path)


def test_header_only_tsv_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dev_mismatched.tsv"
    path.write_text(HEADER + "\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev_mismatched\.tsv: line 1: the file holds no data lines"):
        read_mnli_tsv(path)


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_empty_jsonl_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "multinli_1.0_dev_matched.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"multinli_1\.0_dev_matched\.jsonl: line 1: the file holds no data lines"):
        read_mnli_jsonl(path)


def test_well_formed_files_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("\n".join([HEADER, tsv_row(0), tsv_row(1, "-"), tsv_row(2, "contradiction")]) + "\n")
    split = read_mnli_tsv(path)
    assert split.text_a == ["the premise number 0", "the premise number 2"]
    assert split.text_b == ["the hypothesis 0", "the hypothesis 2"]
    assert split.labels == [1, 2]
