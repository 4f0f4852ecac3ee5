"""LightningDataModules and tokenizer helpers: sentence pairs, a code corpus and click logs (TorchRec, lazy).

Split names are ``"train"``, ``"val"`` and ``"test"`` everywhere (``splits.py``).
"""

from comera_lightning._optional import lazy_exports
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
from comera_lightning.data.resumable import EpochShuffleSampler, ResumableDataLoader
from comera_lightning.data.splits import SPLITS
from comera_lightning.data.text_base import TokenizedTextDataModule
from comera_lightning.data.tokenizer import (
    default_cache_dir,
    load_or_train_bytelevel_bpe,
    load_or_train_wordpiece,
)

__all__ = [
    "CodeCorpusDataModule",
    "EpochShuffleSampler",
    "LengthBucketBatchSampler",
    "MLMCollator",
    "PairCollator",
    "ResumableDataLoader",
    "SPLITS",
    "SentencePairDataModule",
    "TokenizedTextDataModule",
    "default_cache_dir",
    "load_clothing_reviews",
    "load_mnli_dir",
    "load_or_train_bytelevel_bpe",
    "load_or_train_wordpiece",
    "read_mnli_jsonl",
    "read_mnli_tsv",
]

# The click-log modules need TorchRec (an optional extra): import them only when asked for.
_CLICK_LOG_EXPORTS = {
    "ClickBatch": "click_logs",
    "ClickLogDataModule": "click_logs",
    "MovieLensClicksDataModule": "movielens",
    "CriteoDataModule": "criteo",
    "SyntheticCriteoDataModule": "criteo",
}
__all__ += list(_CLICK_LOG_EXPORTS)

__getattr__ = lazy_exports(__name__, _CLICK_LOG_EXPORTS)
