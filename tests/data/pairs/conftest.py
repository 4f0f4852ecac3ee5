"""A folder of small GLUE MNLI TSV files, for the sentence-pair tests."""

from pathlib import Path

import pytest

from tests.helpers.pair_files import random_rows, write_tsv


@pytest.fixture
def mnli_tsv_dir(tmp_path: Path) -> Path:
    root = tmp_path / "glue_mnli"
    root.mkdir()
    write_tsv(root / "train.tsv", random_rows(60, 0))
    write_tsv(root / "dev_matched.tsv", random_rows(20, 1))
    write_tsv(root / "dev_mismatched.tsv", random_rows(15, 2))
    return root
