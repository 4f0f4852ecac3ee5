"""Criteo click logs: TSV files cut into reader shares (``shards``) and parsed in blocks (``vectorised``, ``tsv``),
days converted once to ``.npy`` (``npy``), synthetic batches (``synthetic``), the DataModules (``datamodule``)."""

from comera_lightning.data.criteo.datamodule import CriteoDataModule, SyntheticCriteoDataModule
from comera_lightning.data.criteo.npy import CriteoNpyDataset, convert_criteo_day
from comera_lightning.data.criteo.synthetic import SyntheticCriteoDataset
from comera_lightning.data.criteo.tsv import CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES, CriteoIterableDataset, parse_criteo_line

__all__ = [
    "CRITEO_CAT_NAMES", "CRITEO_KAGGLE_TABLE_SIZES", "CriteoDataModule", "CriteoIterableDataset", "CriteoNpyDataset",
    "SyntheticCriteoDataModule", "SyntheticCriteoDataset", "convert_criteo_day", "parse_criteo_line",
]
