"""Malformed MNLI files (GLUE TSV and MultiNLI JSONL): each error names the file and the line."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from comera_lightning.data.pairs import SentencePairDataModule, load_mnli_dir
from comera_lightning.data.pairs.mnli import read_mnli_jsonl, read_mnli_tsv
from tests.helpers.pair_files import GLUE_HEADER, random_rows, write_jsonl, write_tsv

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


def test_tsv_parser_finds_columns_by_name_and_keeps_quotes(tmp_path: Path) -> None:
    rows = [('He said "hi', "a 'quoted' reply", "neutral"), ("A", "B", "contradiction"), ("C", "D", "entailment")]
    split = read_mnli_tsv(write_tsv(tmp_path / "dev_matched.tsv", rows))
    assert split.text_a == ['He said "hi', "A", "C"]
    assert split.text_b == ["a 'quoted' reply", "B", "D"]
    assert split.labels == [1, 2, 0]


def test_tsv_column_order_does_not_matter(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("gold_label\tsentence2\tsentence1\nentailment\tsecond\tfirst\n", encoding="utf-8")
    split = read_mnli_tsv(path)
    assert (split.text_a, split.text_b, split.labels) == (["first"], ["second"], [0])


def test_jsonl_parser_skips_no_consensus_labels(tmp_path: Path) -> None:
    rows = [("a", "b", "entailment"), ("c", "d", "-"), ("e", "f", "contradiction")]
    split = read_mnli_jsonl(write_jsonl(tmp_path / "multinli_1.0_train.jsonl", rows))
    assert split.text_a == ["a", "e"] and split.labels == [0, 2]


def test_tsv_missing_column_names_file_line_and_column(tmp_path: Path) -> None:
    header = [h for h in GLUE_HEADER if h != "gold_label"]
    path = tmp_path / "train.tsv"
    path.write_text("\t".join(header) + "\n" + "\t".join(["x"] * len(header)) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.tsv: line 1: .*'gold_label'"):
        read_mnli_tsv(path)


def test_tsv_unknown_label_names_line(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", [("a", "b", "neutral"), ("c", "d", "foo")])
    expected = r"train\.tsv: line 3: unknown label 'foo'.*entailment, neutral, contradiction"
    with pytest.raises(ValueError, match=expected):
        read_mnli_tsv(path)


def test_tsv_short_row_names_line(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", [("a", "b", "neutral")])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("7\tonly\tthree\n")
    with pytest.raises(ValueError, match=r"train\.tsv: line 3: expected 12 tab-separated fields.*found 3"):
        read_mnli_tsv(path)


def test_jsonl_bad_json_names_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "multinli_1.0_dev_matched.jsonl", [("a", "b", "neutral")])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"sentence1": "x", "sentence2": \n')
    with pytest.raises(ValueError, match=r"multinli_1\.0_dev_matched\.jsonl: line 2: invalid JSON"):
        read_mnli_jsonl(path)


def test_jsonl_missing_key_and_unknown_label(tmp_path: Path) -> None:
    path = tmp_path / "multinli_1.0_train.jsonl"
    path.write_text('{"sentence1": "a", "sentence2": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 1: missing key 'gold_label'"):
        read_mnli_jsonl(path)
    path.write_text('{"sentence1": "a", "sentence2": "b", "gold_label": "neutral"}\n'
                    '{"sentence1": "a", "sentence2": "b", "gold_label": "maybe"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: unknown label 'maybe'"):
        read_mnli_jsonl(path)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_mnli_tsv(tmp_path / "nope.tsv")
    with pytest.raises(FileNotFoundError, match="train.tsv.*dev_matched.tsv"):
        load_mnli_dir(tmp_path)  # neither layout present
    write_tsv(tmp_path / "train.tsv", random_rows(3, 0))
    write_tsv(tmp_path / "dev_matched.tsv", random_rows(3, 1))
    with pytest.raises(FileNotFoundError, match="lacks dev_mismatched.tsv"):
        load_mnli_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        load_mnli_dir(tmp_path / "missing_dir")


def test_jsonl_layout_is_detected(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "multinli_1.0_train.jsonl", random_rows(9, 0))
    write_jsonl(tmp_path / "multinli_1.0_dev_matched.jsonl", random_rows(6, 1))
    write_jsonl(tmp_path / "multinli_1.0_dev_mismatched.jsonl", random_rows(3, 2))
    splits = load_mnli_dir(tmp_path)
    assert {k: len(v) for k, v in splits.items()} == {"train": 9, "val": 6, "test": 3}


def test_hub_without_datasets_package_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    dm = SentencePairDataModule(source="hub")
    with pytest.raises(ImportError, match="pip install datasets"):
        dm.prepare_data()


def test_hub_unreachable_is_a_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(ConnectionError, match="glue/mnli.*huggingface.co"):
        SentencePairDataModule(source="hub").prepare_data()


def test_hub_splits_map_to_matched_and_mismatched(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(name: str, config: str) -> dict:
        assert (name, config) == ("glue", "mnli")
        part = {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"], "label": [2, -1]}
        return {"train": part, "validation_matched": {**part, "premise": ["m", "x"]},
                "validation_mismatched": {**part, "premise": ["mm", "x"]}}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake))
    dm = SentencePairDataModule(source="hub")
    assert dm.splits["train"].labels == [2]
    assert dm.splits["val"].text_a == ["m"] and dm.splits["test"].text_a == ["mm"]
