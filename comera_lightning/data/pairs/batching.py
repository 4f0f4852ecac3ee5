"""Batching of encoded sentence pairs: the flat `EncodedPairs` dataset, `PairCollator` and `LengthBucketBatchSampler`."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import BatchSampler, Dataset, Sampler

from comera_lightning.data.pairs.split import PairSplit

__all__ = ["EncodedPairs", "LengthBucketBatchSampler", "PairCollator"]



class EncodedPairs(Dataset):
    """Token ids of encoded pairs, stored flat (one numpy array plus offsets) to keep big corpora small in memory."""

    def __init__(self, ids: np.ndarray, type_ids: np.ndarray, offsets: np.ndarray, labels: np.ndarray) -> None:
        self.ids, self.type_ids, self.offsets, self.labels = ids, type_ids, offsets, labels

    @classmethod
    def encode(cls, tokenizer: Tokenizer, split: PairSplit, chunk_size: int = 8192) -> EncodedPairs:
        """Encode a split with a tokenizer that already has truncation enabled."""
        ids: list[np.ndarray] = []
        type_ids: list[np.ndarray] = []
        for start in range(0, len(split), chunk_size):
            batch = list(zip(split.text_a[start:start + chunk_size], split.text_b[start:start + chunk_size]))
            for enc in tokenizer.encode_batch(batch):
                ids.append(np.asarray(enc.ids, dtype=np.int32))
                type_ids.append(np.asarray(enc.type_ids, dtype=np.int8))
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        flat_types = np.concatenate(type_ids) if type_ids else np.zeros(0, np.int8)
        return cls(flat, flat_types, offsets, np.asarray(split.labels, dtype=np.int64))

    @property
    def lengths(self) -> np.ndarray:
        """Number of tokens of every example (special tokens included)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        lo, hi = self.offsets[index], self.offsets[index + 1]
        return {"input_ids": self.ids[lo:hi], "token_type_ids": self.type_ids[lo:hi], "labels": int(self.labels[index])}


class PairCollator:
    """Pad encoded pairs into a batch dict, to a fixed `pad_to` length or to the longest sequence of the batch."""

    def __init__(self, pad_token_id: int, pad_to: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to = pad_to

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack a list of examples into `input_ids`, `token_type_ids`, `attention_mask` and `labels`."""
        longest = max(len(item["input_ids"]) for item in items)
        length = self.pad_to if self.pad_to is not None else longest
        input_ids = torch.full((len(items), length), self.pad_token_id, dtype=torch.long)
        token_type_ids = torch.zeros((len(items), length), dtype=torch.long)
        attention_mask = torch.zeros((len(items), length), dtype=torch.bool)
        for row, item in enumerate(items):
            n = min(len(item["input_ids"]), length)
            input_ids[row, :n] = torch.from_numpy(item["input_ids"][:n].astype(np.int64))
            token_type_ids[row, :n] = torch.from_numpy(item["token_type_ids"][:n].astype(np.int64))
            attention_mask[row, :n] = True
        labels = torch.tensor([item["labels"] for item in items], dtype=torch.long)
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
                "labels": labels}


class LengthBucketBatchSampler(BatchSampler):
    """Batches of similar lengths: take `batch_size * bucket_size_multiplier` indices from `sampler`, sort them
    by length, cut into batches, and (if `shuffle`) shuffle the batch order with a generator seeded by `seed`
    and the epoch (the sampler's `epoch`, set by Lightning, else the number of iterations so far).

    It keeps `BatchSampler`'s `(sampler, batch_size, drop_last)` arguments, so Lightning can swap in a
    `DistributedSampler` under DDP; the sampler's order decides which examples share a bucket.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        batch_size: int,
        drop_last: bool,
        lengths: Sequence[int] | np.ndarray = (),
        bucket_size_multiplier: int = 50,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        if bucket_size_multiplier < 1:
            raise ValueError(f"bucket_size_multiplier must be >= 1, got {bucket_size_multiplier}")
        self.lengths = np.asarray(lengths)
        self.bucket_size_multiplier = bucket_size_multiplier
        self.shuffle = shuffle
        self.seed = seed
        self._iterations = 0

    def __iter__(self) -> Iterator[list[int]]:
        indices = list(self.sampler)
        bucket = self.batch_size * self.bucket_size_multiplier  # a multiple of batch_size: partial batch only at end
        batches: list[list[int]] = []
        for start in range(0, len(indices), bucket):
            chunk = sorted(indices[start:start + bucket], key=lambda i: self.lengths[i])
            batches.extend(chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        epoch = getattr(self.sampler, "epoch", None)
        epoch = self._iterations if epoch is None else epoch
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + 1_000_003 * epoch)
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        self._iterations = epoch + 1
        yield from batches

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
