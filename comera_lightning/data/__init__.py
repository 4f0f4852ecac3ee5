"""LightningDataModules and tokenizer helpers: sentence pairs (MNLI, clothing reviews) and a code corpus."""

from comera_lightning.data.code_corpus import CodeCorpusDataModule, MLMCollator
from comera_lightning.data.sentence_pairs import (
    LengthBucketBatchSampler,
    PairCollator,
    SentencePairDataModule,
    load_clothing_reviews,
    load_mnli_dir,
    read_mnli_jsonl,
    read_mnli_tsv,
)
from comera_lightning.data.tokenizer import (
    default_cache_dir,
    load_or_train_bytelevel_bpe,
    load_or_train_wordpiece,
)

__all__ = [
    "CodeCorpusDataModule",
    "LengthBucketBatchSampler",
    "MLMCollator",
    "PairCollator",
    "SentencePairDataModule",
    "default_cache_dir",
    "load_clothing_reviews",
    "load_mnli_dir",
    "load_or_train_bytelevel_bpe",
    "load_or_train_wordpiece",
    "read_mnli_jsonl",
    "read_mnli_tsv",
]
