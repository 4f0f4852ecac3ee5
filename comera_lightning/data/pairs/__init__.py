"""Sentence-pair classification: MNLI and the clothing reviews read (``mnli``, ``clothing_reviews``) into
:class:`PairSplit` s (``split``), batched (``batching``), served by :class:`SentencePairDataModule` (``datamodule``)."""

from comera_lightning.data.pairs.batching import EncodedPairs, LengthBucketBatchSampler, PairCollator
from comera_lightning.data.pairs.clothing_reviews import clothing_reviews_path, load_clothing_reviews, rating_to_label
from comera_lightning.data.pairs.datamodule import SentencePairDataModule
from comera_lightning.data.pairs.mnli import load_mnli_dir, load_mnli_hub, read_mnli_jsonl, read_mnli_tsv
from comera_lightning.data.pairs.split import PairSplit

__all__ = [
    "EncodedPairs", "LengthBucketBatchSampler", "PairCollator", "PairSplit", "SentencePairDataModule", "clothing_reviews_path",
    "load_clothing_reviews", "load_mnli_dir", "load_mnli_hub", "rating_to_label", "read_mnli_jsonl", "read_mnli_tsv",
]
