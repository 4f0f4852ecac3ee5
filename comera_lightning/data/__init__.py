"""LightningDataModules, one folder per dataset family (``criteo/``, ``movielens/``, ``pairs/``, ``code/``,
``text/``), and the pieces they share (``splits``, ``resumable``, ``tokenizer``, ``text_base``, ``click_logs``,
``wheel_data``, ``errors``, ``hparams``, ``jsonl``).

Split names are ``"train"``, ``"val"`` and ``"test"`` everywhere (``splits.py``).
"""

from comera_lightning._optional import lazy_exports
from comera_lightning.data.resumable import EpochShuffleSampler, ResumableDataLoader
from comera_lightning.data.splits import SPLITS

# The text modules need tokenizers / pyarrow (the cli extra) and the click-log modules TorchRec (the
# recsys extra): each is imported on first use, so `import comera_lightning` needs only the core.
_LAZY_EXPORTS = {
    "CodeCorpusDataModule": "code",
    "MLMCollator": "code",
    "LengthBucketBatchSampler": "pairs",
    "PairCollator": "pairs",
    "SentencePairDataModule": "pairs",
    "load_clothing_reviews": "pairs",
    "load_mnli_dir": "pairs",
    "read_mnli_jsonl": "pairs",
    "read_mnli_tsv": "pairs",
    "TextFilesDataModule": "text",
    "TokenizedTextDataModule": "text_base",
    "default_cache_dir": "tokenizer",
    "load_or_train_bytelevel_bpe": "tokenizer",
    "load_or_train_wordpiece": "tokenizer",
    "ClickBatch": "click_logs",
    "ClickLogDataModule": "click_logs",
    "MovieLensClicksDataModule": "movielens",
    "CriteoDataModule": "criteo",
    "SyntheticCriteoDataModule": "criteo",
}
__all__ = ["EpochShuffleSampler", "ResumableDataLoader", "SPLITS", *_LAZY_EXPORTS]

__getattr__ = lazy_exports(__name__, _LAZY_EXPORTS)
