"""Sentence-pair batching: length buckets, padding to the longest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from comera_lightning.data.pairs import LengthBucketBatchSampler, SentencePairDataModule


def test_bucket_sampler_groups_lengths_and_is_deterministic() -> None:
    lengths = np.random.default_rng(0).integers(5, 128, size=1000)

    def batches(seed: int) -> list[list[int]]:
        sampler = torch.utils.data.RandomSampler(range(1000), generator=torch.Generator().manual_seed(seed))
        return list(LengthBucketBatchSampler(sampler, 16, False, lengths=lengths, bucket_size_multiplier=20,
                                             seed=seed))

    first = batches(0)
    assert sorted(i for batch in first for i in batch) == list(range(1000))
    assert len(first) == 63 and first == batches(0) and first != batches(1)
    spread = np.mean([np.ptp(lengths[b]) for b in first])
    assert spread < 10  # a random batch of 16 spans about 100 lengths
    sampler = LengthBucketBatchSampler(range(1000), 16, True, lengths=lengths)
    assert len(sampler) == 62 and all(len(b) == 16 for b in sampler)
    epoch1, epoch2 = list(sampler), list(sampler)
    assert epoch1 != epoch2  # the batch order is reshuffled every epoch


def test_bucketing_pads_to_longest(mnli_tsv_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=8, vocab_size=200,
                                bucket_by_length=True, bucket_size_multiplier=4)
    dm.setup("fit")
    seen = 0
    for batch in dm.train_dataloader():
        width = batch["input_ids"].shape[1]
        assert width == int(batch["attention_mask"].sum(1).max()) < dm.max_length
        seen += len(batch["labels"])
    assert seen == 60
    assert sum(len(b["labels"]) for b in dm.val_dataloader()) == 20
