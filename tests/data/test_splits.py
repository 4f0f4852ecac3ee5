"""Split names ("train", "val", "test") everywhere, the readers' split keys, and the one check of split fractions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from comera_lightning.data.code import CodeCorpusDataModule, split_documents
from comera_lightning.data.code.files import CodeDocument
from comera_lightning.data.code.splits import split_of
from comera_lightning.data.pairs import SentencePairDataModule, load_mnli_dir
from comera_lightning.data.splits import SPLITS, STAGE_SPLITS, check_split_fractions, resolve_split


@pytest.fixture
def mnli_dir(tmp_path: Path) -> Path:
    root = tmp_path / "mnli"
    root.mkdir()
    labels = ("entailment", "neutral", "contradiction")
    for name, n in (("train.tsv", 12), ("dev_matched.tsv", 6), ("dev_mismatched.tsv", 3)):
        rows = [f"the cat sat {i}\ta dog ran {i}\t{labels[i % 3]}" for i in range(n)]
        (root / name).write_text("sentence1\tsentence2\tgold_label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return root


def test_split_names() -> None:
    assert SPLITS == ("train", "val", "test")
    assert STAGE_SPLITS["fit"] == ("train", "val") and STAGE_SPLITS["validate"] == ("val",)
    assert all(resolve_split(name) == name for name in SPLITS)
    for other in ("dev", "validation"):
        with pytest.raises(ValueError, match=f"unknown split '{other}'"):
            resolve_split(other)


def test_readers_return_val(mnli_dir: Path) -> None:
    splits = load_mnli_dir(mnli_dir)
    assert list(splits) == ["train", "val", "test"] and len(splits["val"]) == 6
    docs = [CodeDocument(f"f{i}.py", "x = 1\n") for i in range(20)]
    assert set(split_documents(docs, 0.3, 0.3)) == {"train", "val", "test"}
    assert {split_of(d.key, 0.3, 0.3) for d in docs} == {"train", "val", "test"}


def test_data_modules_take_split_names_only(mnli_dir: Path, tmp_path: Path) -> None:
    pairs = SentencePairDataModule(source="mnli", data_dir=str(mnli_dir), batch_size=4, vocab_size=60)
    assert pairs.class_counts("val") == pairs.class_counts() == {"entailment": 2, "neutral": 2, "contradiction": 2}
    assert len(pairs.dataset("val")) == 6
    for i in range(30):
        (tmp_path / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + 1\n" * 5, encoding="utf-8")
    code = CodeCorpusDataModule(source_dirs=[str(tmp_path)], block_size=16, batch_size=4, vocab_size=300,
                                val_fraction=0.2, test_fraction=0.2)
    assert set(code.documents) == {"train", "val", "test"}
    for module in (pairs, code):
        with pytest.raises(ValueError, match="unknown split 'validation'"):
            module.dataset("validation")


@pytest.mark.parametrize("fractions, allow_empty", [((0.0, 0.1), True), ((0.1, 0.1), False), ((0.5, 0.49), True)])
def test_split_fractions_that_leave_rows_for_training(fractions, allow_empty) -> None:
    check_split_fractions(*fractions, allow_empty=allow_empty)


@pytest.mark.parametrize("fractions, allow_empty, interval", [((0.0, 0.1), False, "(0, 1)"), ((-0.1, 0.1), True, "[0, 1)"),
                                                             ((0.5, 0.5), True, "[0, 1)"), ((1.0, 0.0), True, "[0, 1)")])
def test_split_fractions_out_of_range_are_refused(fractions, allow_empty, interval) -> None:
    with pytest.raises(ValueError, match=rf"val_fraction and test_fraction must be in {re.escape(interval)} with a sum below 1"):
        check_split_fractions(*fractions, allow_empty=allow_empty)


def test_synthetic_criteo_takes_split_names_only() -> None:
    pytest.importorskip("torchrec")
    from comera_lightning.data.criteo import SyntheticCriteoDataModule

    dm = SyntheticCriteoDataModule(batch_size=4, num_batches=2, val_batches=3, table_sizes=[10, 20])
    assert len(dm.dataset("val")) == 3
    with pytest.raises(ValueError, match="unknown split"):
        dm.dataset("dev")
