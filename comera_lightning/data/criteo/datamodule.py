"""Criteo LightningDataModules: `CriteoDataModule` (TSV files on disk, streamed) and `SyntheticCriteoDataModule`.

The file reader is `tsv.py` (or `npy.py` for days converted once), the synthetic batches are `synthetic.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import DataLoader

from comera_lightning.data.click_logs import ClickLogDataModule, DatasetNotFoundError
from comera_lightning.data.criteo.npy import CriteoNpyDataset, is_converted_day
from comera_lightning.data.criteo.synthetic import SyntheticCriteoDataset
from comera_lightning.data.criteo.tsv import (
    CRITEO_CAT_NAMES,
    CRITEO_KAGGLE_TABLE_SIZES,
    NUM_DENSE,
    CriteoIterableDataset,
    check_table_sizes,
)
from comera_lightning.data.hparams import BatchSizeHParams
from comera_lightning.data.splits import resolve_split

__all__ = ["CriteoDataModule", "SyntheticCriteoDataModule"]

log = logging.getLogger(__name__)


def _as_file_list(files: str | Sequence[str] | None) -> list[str]:
    """Normalise a path or a list of paths to a list."""
    if files is None:
        return []
    if isinstance(files, (str, Path)):
        return [str(files)]
    return [str(f) for f in files]


class CriteoDataModule(BatchSizeHParams, ClickLogDataModule):
    """Criteo Display Advertising TSV files from disk (plain or ``.gz``), streamed.

    ``train_files``, ``val_files`` and ``test_files`` are paths (a path or a list each; a
    list is read in order, e.g. days 0..22): TSV files, or folders made from them once by
    ``python -m comera_lightning.data.criteo.npy`` (memory-mapped, much faster per epoch).
    ``table_sizes`` defaults to the Kaggle cardinalities. Batches are built by the reading workers, each rank × worker parsing only
    its byte range of every plain file (gzip files go whole to one reader: give at least as many
    ``.gz`` files as readers, or decompress them once); lines are not shuffled (as in the DLRM
    reference, which reads the days in order). The arguments are read back from ``self.hparams``.
    """

    def __init__(
        self,
        train_files: list[str] | str | None = None,
        val_files: list[str] | str | None = None,
        test_files: list[str] | str | None = None,
        batch_size: int = 2048,
        eval_batch_size: int | None = None,
        table_sizes: list[int] | None = None,
        num_workers: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if batch_size <= 0 or (eval_batch_size is not None and eval_batch_size <= 0):
            raise ValueError(
                f"batch sizes must be positive, got batch_size={batch_size}, eval_batch_size={eval_batch_size}."
            )
        check_table_sizes(table_sizes)
        self.save_hyperparameters()

    @property
    def files(self) -> dict[str, list[str]]:
        """The files of each split ('train', 'val', 'test'), in reading order."""
        hp = self.hparams
        return {
            "train": _as_file_list(hp.train_files),
            "val": _as_file_list(hp.val_files),
            "test": _as_file_list(hp.test_files),
        }

    @property
    def feature_names(self) -> list[str]:
        """``cat_0`` … ``cat_25`` (TorchRec's DEFAULT_CAT_NAMES)."""
        return list(CRITEO_CAT_NAMES)

    @property
    def table_sizes(self) -> list[int]:
        """Rows per categorical table (ids are hashes modulo these)."""
        return check_table_sizes(self.hparams.table_sizes)

    @property
    def num_dense(self) -> int:
        """13 integer features."""
        return NUM_DENSE

    def prepare_data(self) -> None:
        """Check that every configured file exists, and that a split is all TSV files or all converted days."""
        for split, files in self.files.items():
            for path in files:
                if not Path(path).is_file() and not is_converted_day(path):
                    raise DatasetNotFoundError(
                        f"{split} file {path!r} does not exist (nor is it a folder made by convert_criteo_day); "
                        f"fix {split}_files."
                    )
            converted = [is_converted_day(path) for path in files]
            if any(converted) and not all(converted):
                raise ValueError(f"{split}_files mixes TSV files and converted days; give one kind per split.")

    def setup(self, stage: str | None = None) -> None:
        """Validate the paths (nothing is loaded: the files are streamed)."""
        self.prepare_data()
        log.info("Criteo files: %s", {split: files for split, files in self.files.items() if files})

    def train_dataloader(self) -> DataLoader:
        """Batches streamed from ``train_files``."""
        return self._loader("train", self.batch_size, self.hparams.drop_last)

    def val_dataloader(self) -> DataLoader:
        """Batches streamed from ``val_files``."""
        return self._loader("val", self.eval_batch_size, False)

    def test_dataloader(self) -> DataLoader:
        """Batches streamed from ``test_files``."""
        return self._loader("test", self.eval_batch_size, False)

    def _loader(self, split: str, batch_size: int, drop_last: bool) -> DataLoader:
        files = self.files[split]
        if not files:
            raise ValueError(f"no {split} files configured; pass {split}_files= one or more Criteo TSV paths.")
        if is_converted_day(files[0]):
            dataset = CriteoNpyDataset(files, batch_size, self.table_sizes, drop_last=drop_last)
        else:
            dataset = CriteoIterableDataset(files, batch_size, self.table_sizes, drop_last=drop_last)
        return DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            pin_memory=self.hparams.pin_memory,
        )


class SyntheticCriteoDataModule(BatchSizeHParams, ClickLogDataModule):
    """Synthetic Criteo-shaped data at full table cardinalities, for memory and speed benchmarks.

    Seeded and deterministic (batch ``i`` of a split is the same on every run and in every
    worker); ``num_batches`` training batches, ``val_batches``/``test_batches`` for evaluation.
    The arguments are read back from ``self.hparams``.
    """

    def __init__(
        self,
        batch_size: int = 2048,
        num_batches: int = 100,
        val_batches: int = 10,
        test_batches: int = 10,
        table_sizes: list[int] | None = None,
        num_dense: int = NUM_DENSE,
        zipf_exponent: float = 1.05,
        seed: int = 0,
        scatter_ids: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        _check_synthetic_arguments(batch_size, num_batches, val_batches, test_batches, table_sizes, num_dense,
                                   zipf_exponent)
        self.save_hyperparameters()

    @property
    def feature_names(self) -> list[str]:
        """``cat_0`` … ``cat_{T-1}``, one per table."""
        return [f"cat_{i}" for i in range(len(self.table_sizes))]

    @property
    def table_sizes(self) -> list[int]:
        """Rows per table (Criteo Kaggle cardinalities by default)."""
        table_sizes = self.hparams.table_sizes
        return list(CRITEO_KAGGLE_TABLE_SIZES if table_sizes is None else table_sizes)

    @property
    def num_dense(self) -> int:
        """Number of dense features (13 by default)."""
        return self.hparams.num_dense

    def split_batches(self, split: str) -> int:
        """Number of batches of ``split`` ('train', 'val' or 'test')."""
        hp = self.hparams
        return {"train": hp.num_batches, "val": hp.val_batches, "test": hp.test_batches}[resolve_split(split)]

    def dataset(self, split: str) -> SyntheticCriteoDataset:
        """The deterministic batch dataset of ``split`` (each split has its own seed stream)."""
        split = resolve_split(split)
        hp = self.hparams
        return SyntheticCriteoDataset(
            num_batches=self.split_batches(split),
            batch_size=self.batch_size,
            table_sizes=self.table_sizes,
            num_dense=hp.num_dense,
            zipf_exponent=hp.zipf_exponent,
            seed=hp.seed,
            stream={"train": 0, "val": 1, "test": 2}[split],
            scatter_ids=hp.scatter_ids,
        )

    def train_dataloader(self) -> DataLoader:
        """``num_batches`` synthetic training batches."""
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        """``val_batches`` synthetic validation batches."""
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        """``test_batches`` synthetic test batches."""
        return self._loader("test")

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(
            self.dataset(split),
            batch_size=None,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
            pin_memory=self.hparams.pin_memory,
        )


def _check_synthetic_arguments(batch_size: int, num_batches: int, val_batches: int, test_batches: int,
                               table_sizes: list[int] | None, num_dense: int, zipf_exponent: float) -> None:
    """Raise a ValueError for non-positive sizes, an empty or non-positive table list, or a bad exponent."""
    if batch_size <= 0 or num_batches <= 0 or val_batches < 0 or test_batches < 0:
        raise ValueError(
            "batch_size and num_batches must be positive and val/test_batches non-negative, got "
            f"batch_size={batch_size}, num_batches={num_batches}, "
            f"val_batches={val_batches}, test_batches={test_batches}."
        )
    if zipf_exponent <= 0:
        raise ValueError(f"zipf_exponent must be positive (about 1 for click logs), got {zipf_exponent}.")
    if num_dense < 1:
        raise ValueError(f"num_dense must be at least 1, got {num_dense}.")
    if table_sizes is not None and (not table_sizes or any(int(s) < 1 for s in table_sizes)):
        raise ValueError(f"table_sizes must be a non-empty list of positive integers, got {table_sizes}.")
