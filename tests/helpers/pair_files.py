"""Sentence-pair files for the data tests: GLUE-style TSV and MultiNLI JSONL rows of random sentences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GLUE_HEADER = [
    "index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
    "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label",
]


WORDS = ("the cat sat on a mat while dogs ran in parks and birds sang songs about rain sun wind "
         "people walked slowly toward old houses near rivers under bright stars").split()


def _sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n))


def _tsv_row(i: int, s1: str, s2: str, label: str) -> str:
    fields = [str(i), "1", f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, label, label]
    return "\t".join(fields)


def write_tsv(path: Path, rows: list[tuple[str, str, str]], header: list[str] = GLUE_HEADER) -> Path:
    lines = ["\t".join(header)] + [_tsv_row(i, *row) for i, row in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    records = [{"annotator_labels": [g], "genre": "travel", "gold_label": g, "pairID": str(i),
                "sentence1": a, "sentence2": b} for i, (a, b, g) in enumerate(rows)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def random_rows(n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    labels = ("entailment", "neutral", "contradiction")
    return [(_sentence(rng, int(rng.integers(3, 12))), _sentence(rng, int(rng.integers(3, 20))), labels[i % 3])
            for i in range(n)]
