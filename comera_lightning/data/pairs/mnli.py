"""Readers of GLUE MNLI: the GLUE TSV files, the MultiNLI 1.0 JSONL files, a folder of either, or the hub.

Every reader returns :class:`~comera_lightning.data.pairs.split.PairSplit` s with label ids in
``MNLI_LABELS`` order; pairs without annotator consensus (gold label ``-``) are skipped, as in
GLUE. A folder (or the hub) gives the splits ``"train"``, ``"val"`` (dev-matched) and
``"test"`` (dev-mismatched).
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import IO, Any

from comera_lightning.data.errors import empty_file_error, utf8_error
from comera_lightning.data.pairs.split import PairSplit

__all__ = [
    "MNLI_FIELDS",
    "MNLI_JSONL_FILES",
    "MNLI_LABELS",
    "MNLI_TSV_FILES",
    "load_mnli_dir",
    "load_mnli_hub",
    "read_mnli_jsonl",
    "read_mnli_tsv",
]

MNLI_LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
MNLI_TSV_FILES = {"train": "train.tsv", "val": "dev_matched.tsv", "test": "dev_mismatched.tsv"}
MNLI_JSONL_FILES = {
    "train": "multinli_1.0_train.jsonl",
    "val": "multinli_1.0_dev_matched.jsonl",
    "test": "multinli_1.0_dev_mismatched.jsonl",
}
MNLI_FIELDS = ("sentence1", "sentence2", "gold_label")
_HUB_SPLITS = (("train", "train"), ("val", "validation_matched"), ("test", "validation_mismatched"))


def _mnli_label(value: Any, path: Path, lineno: int) -> int | None:
    """Map a gold label to its id; None for '-' (no annotator consensus, skipped as in GLUE)."""
    label = str(value).strip()
    if label == "-":
        return None
    if label not in MNLI_LABELS:
        raise ValueError(
            f"{path}: line {lineno}: unknown label {label!r} in `gold_label`; expected one of {', '.join(MNLI_LABELS)}"
        )
    return MNLI_LABELS.index(label)


def read_mnli_tsv(path: str | os.PathLike[str]) -> PairSplit:
    """Read a GLUE MNLI TSV file, finding `sentence1`, `sentence2` and `gold_label` by header name."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MNLI file {str(path)!r} does not exist")
    # GLUE TSVs are unquoted (quotes are literal text), so split on tabs rather than using `csv`;
    # newline="\n" keeps a stray carriage return inside a sentence from splitting the line.
    try:
        with open(path, encoding="utf-8", newline="\n") as handle:
            split, rows = _read_tsv_rows(handle, path)
    except UnicodeDecodeError as err:
        raise utf8_error(path, err) from err
    if not rows:
        raise empty_file_error(path, f"a header with columns {', '.join(MNLI_FIELDS)} and one row per pair")
    return split


def _read_tsv_rows(handle: IO[str], path: Path) -> tuple[PairSplit, int]:
    """Parse the header and rows of an open MNLI TSV: the pairs and the number of non-blank rows."""
    split = PairSplit()
    header_line = handle.readline()
    if not header_line.strip():
        raise ValueError(f"{path}: line 1: empty file; expected a header with columns {', '.join(MNLI_FIELDS)}")
    header = header_line.rstrip("\r\n").split("\t")
    columns = _header_columns(header, path)
    rows = 0
    for lineno, line in enumerate(handle, start=2):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise ValueError(
                f"{path}: line {lineno}: expected {len(header)} tab-separated fields (as in the header), "
                f"found {len(fields)}; a tab inside a sentence shifts the columns: remove it or fix the row"
            )
        rows += 1
        label = _mnli_label(fields[columns["gold_label"]], path, lineno)
        if label is not None:
            split.append(fields[columns["sentence1"]], fields[columns["sentence2"]], label)
    return split, rows


def _header_columns(header: list[str], path: Path) -> dict[str, int]:
    names = [name.strip() for name in header]
    missing = [name for name in MNLI_FIELDS if name not in names]
    if missing:
        raise ValueError(
            f"{path}: line 1: header lacks column {', '.join(repr(m) for m in missing)}; "
            f"expected a GLUE MNLI TSV with columns {', '.join(MNLI_FIELDS)} (found {len(names)} columns: "
            f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''})"
        )
    return {name: names.index(name) for name in MNLI_FIELDS}


def read_mnli_jsonl(path: str | os.PathLike[str]) -> PairSplit:
    """Read a MultiNLI 1.0 JSONL file (keys `sentence1`, `sentence2`, `gold_label`; '-' labels are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MNLI file {str(path)!r} does not exist")
    split = PairSplit()
    records = 0
    try:
        with open(path, encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    records += 1
                    _append_jsonl_record(split, line, path, lineno)
    except UnicodeDecodeError as err:
        raise utf8_error(path, err) from err
    if not records:
        raise empty_file_error(path, f"one JSON object per line with keys {', '.join(MNLI_FIELDS)}")
    return split


def _append_jsonl_record(split: PairSplit, line: str, path: Path, lineno: int) -> None:
    """Parse one MultiNLI JSONL line and append its pair to ``split`` (unless its label is '-')."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: line {lineno}: invalid JSON ({err.msg} at column {err.colno}); "
            "expected one JSON object per line"
        ) from err
    if not isinstance(record, dict):
        raise ValueError(f"{path}: line {lineno}: expected a JSON object, found {type(record).__name__}")
    missing = [key for key in MNLI_FIELDS if key not in record]
    if missing:
        raise ValueError(
            f"{path}: line {lineno}: missing key {', '.join(repr(m) for m in missing)}; "
            f"expected keys {', '.join(MNLI_FIELDS)}"
        )
    label = _mnli_label(record["gold_label"], path, lineno)
    if label is not None:
        split.append(str(record["sentence1"]), str(record["sentence2"]), label)


def load_mnli_dir(data_dir: str | os.PathLike[str]) -> dict[str, PairSplit]:
    """Load MNLI train / val (dev-matched) / test (dev-mismatched) from a GLUE TSV or JSONL directory."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"MNLI data_dir {str(root)!r} does not exist or is not a directory")
    for files, reader in ((MNLI_TSV_FILES, read_mnli_tsv), (MNLI_JSONL_FILES, read_mnli_jsonl)):
        if (root / files["train"]).is_file():
            missing = [name for name in files.values() if not (root / name).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"MNLI data_dir {str(root)!r} has {files['train']} but lacks {', '.join(missing)}; "
                    f"expected {', '.join(files.values())}"
                )
            return {split: reader(root / name) for split, name in files.items()}
    raise FileNotFoundError(
        f"MNLI data_dir {str(root)!r} holds neither the GLUE TSV layout ({', '.join(MNLI_TSV_FILES.values())}) "
        f"nor the JSONL layout ({', '.join(MNLI_JSONL_FILES.values())})"
    )


def load_mnli_hub() -> dict[str, PairSplit]:
    """Download GLUE MNLI with the optional `datasets` package (needs a network connection)."""
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as err:
        raise ImportError(
            "source='hub' needs the optional package `datasets` (`pip install datasets`) and a network "
            "connection; offline, use source='mnli' with data_dir=<GLUE MNLI folder>, "
            "or the default source='clothing_reviews'"
        ) from err
    try:
        hub = datasets.load_dataset("glue", "mnli")
    except Exception as err:  # offline errors vary by `datasets` version: wrap them all
        raise ConnectionError(
            f"could not load glue/mnli from the Hugging Face hub ({type(err).__name__}: {err}); "
            "check the network connection, or download MNLI and use source='mnli' with data_dir=..."
        ) from err
    result: dict[str, PairSplit] = {}
    for split, hub_split in _HUB_SPLITS:
        part = PairSplit()
        rows = hub[hub_split]
        for premise, hypothesis, label in zip(rows["premise"], rows["hypothesis"], rows["label"]):
            if label >= 0:  # -1 marks unlabeled rows
                part.append(premise, hypothesis, int(label))
        result[split] = part
    return result

