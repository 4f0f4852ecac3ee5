"""SentencePairDataModule: MNLI batches, limits and a seeded shuffle, truncation, a user tokenizer, mid-epoch resume."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from comera_lightning.data.pairs import SentencePairDataModule
from comera_lightning.data.tokenizer import load_or_train_wordpiece
from tests.helpers.pair_files import WORDS


def test_mnli_source_requires_data_dir() -> None:
    with pytest.raises(ValueError, match="data_dir"):
        SentencePairDataModule(source="mnli")
    with pytest.raises(ValueError, match="source must be"):
        SentencePairDataModule(source="glue")  # type: ignore[arg-type]


def test_mnli_module_batches(mnli_tsv_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=8, vocab_size=200,
                                max_length=32)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_classes == 3 and dm.class_names == ("entailment", "neutral", "contradiction")
    assert dm.pad_token_id == 0 and 21 <= dm.vocab_size <= 200
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == (8, 32)
    assert batch["input_ids"].dtype == batch["token_type_ids"].dtype == batch["labels"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool and batch["labels"].shape == (8,)
    # padding is [PAD] exactly where the mask is off, and the pair template is [CLS] A [SEP] B [SEP]
    assert torch.all((batch["input_ids"] == 0) == ~batch["attention_mask"])
    cls_id, sep_id = dm.tokenizer.token_to_id("[CLS]"), dm.tokenizer.token_to_id("[SEP]")
    assert torch.all(batch["input_ids"][:, 0] == cls_id)
    assert torch.all((batch["input_ids"] == sep_id).sum(1) == 2)
    assert torch.all(batch["token_type_ids"][~batch["attention_mask"]] == 0)
    assert dm.majority_rate == pytest.approx(max(Counter(dm.splits["val"].labels).values()) / 20)
    # test = dev_mismatched
    assert len(dm.dataset("test")) == 15 and len(dm.test_dataloader()) == 2


def test_limits_and_deterministic_shuffle(mnli_tsv_dir: Path) -> None:
    def first_batch(seed: int) -> dict[str, torch.Tensor]:
        dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=4, vocab_size=200,
                                    limit_train_samples=12, limit_eval_samples=5, seed=seed)
        dm.setup("fit")
        assert len(dm.dataset("train")) == 12 and len(dm.dataset("val")) == 5
        return next(iter(dm.train_dataloader()))

    a, b, c = first_batch(0), first_batch(0), first_batch(1)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["input_ids"], c["input_ids"])


def test_truncation_cuts_the_longer_segment_first(mnli_tsv_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), vocab_size=200, max_length=16)
    enc = dm.tokenizer.encode("the cat sat", " ".join(["birds sang songs"] * 20))
    assert len(enc.ids) == 16
    assert dm.tokenizer.decode(enc.ids).startswith("the cat sat")
    assert enc.type_ids.count(0) == 5  # [CLS] the cat sat [SEP] kept whole


def test_user_tokenizer_file_is_loaded_not_trained(tmp_path: Path, mnli_tsv_dir: Path) -> None:
    trained = load_or_train_wordpiece(lambda: iter(WORDS), vocab_size=60, cache_path=tmp_path / "c")
    user_file = tmp_path / "tokenizer.json"
    trained.save(str(user_file))
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), tokenizer_file=str(user_file),
                                cache_dir=str(tmp_path / "unused"))
    assert dm.tokenizer.get_vocab() == trained.get_vocab()
    assert not (tmp_path / "unused").exists()
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        load_or_train_wordpiece(lambda: iter(WORDS), vocab_size=60, tokenizer_file=tmp_path / "nothing.json")


@pytest.mark.parametrize("bucket_by_length", [True, False])
def test_training_batches_resume_mid_epoch_in_the_uninterrupted_order(mnli_tsv_dir: Path, bucket_by_length: bool) -> None:
    """What Lightning does on resume: a new loader, the saved state loaded, the epoch set, then iterated."""
    from comera_lightning.data.resumable import record_consumed_batches

    def loader():
        dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=8, vocab_size=200,
                                    bucket_by_length=bucket_by_length, seed=3)
        dm.setup("fit")
        return dm.train_dataloader()

    def ids(batches):
        return [batch["input_ids"].tolist() for batch in batches]

    def set_epoch(loader, epoch):  # as Lightning does at each epoch start
        (loader.batch_sampler.sampler if bucket_by_length else loader.sampler).set_epoch(epoch)

    straight = loader()
    epochs = []
    for epoch in range(3):
        set_epoch(straight, epoch)
        epochs.append(ids(straight))
    assert epochs[0] != epochs[1], "a new order each epoch"

    interrupted = loader()
    set_epoch(interrupted, 1)
    iterator = iter(interrupted)
    for _ in range(3):
        next(iterator)
    state = interrupted.state_dict()
    record_consumed_batches([state], 3)

    resumed = loader()
    resumed.load_state_dict(state)
    set_epoch(resumed, 1)
    assert ids(resumed) == epochs[1][3:], "the rest of epoch 1"
    set_epoch(resumed, 2)
    assert ids(resumed) == epochs[2], "then a whole epoch 2"
