"""`TokenizedTextDataModule`: the base of the data modules that tokenize text.

It holds what they share: a tokenizer built on first use (and cached by the subclass), one
dataset per split built on first use, the stage-to-splits logic of ``setup`` and the
DataLoaders (a seeded shuffle for training, the split's order for evaluation).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import lightning.pytorch as pl
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from comera_lightning.data.hparams import BatchSizeHParams
from comera_lightning.data.resumable import EpochShuffleSampler, ResumableDataLoader
from comera_lightning.data.splits import SPLITS, STAGE_SPLITS, resolve_split

__all__ = ["TokenizedTextDataModule"]


class TokenizedTextDataModule(BatchSizeHParams, pl.LightningDataModule, metaclass=abc.ABCMeta):
    """Base of the tokenized-text data modules: tokenizer, per-split datasets, loaders.

    A subclass calls ``self.save_hyperparameters()`` in its ``__init__`` with at least
    ``batch_size``, ``eval_batch_size``, ``seed``, ``num_workers`` and ``drop_last`` among its
    arguments, and implements:

    * ``_build_tokenizer()``: the tokenizer (trained and cached, or loaded);
    * ``_build_dataset(split)``: the dataset of ``"train"``, ``"val"`` or ``"test"``;
    * ``collate_fn(split)``: the collate function of that split's loader.

    ``pad_token`` names the padding token (``pad_token_id`` is its id).
    """

    pad_token: ClassVar[str] = "[PAD]"

    def __init__(self) -> None:
        super().__init__()
        self._tokenizer: Tokenizer | None = None
        self._datasets: dict[str, Any] = {}

    # ---- to implement

    @abc.abstractmethod
    def _build_tokenizer(self) -> Tokenizer:
        """The tokenizer (trained and cached, or loaded)."""

    @abc.abstractmethod
    def _build_dataset(self, split: str) -> Dataset:
        """The dataset of ``split``."""

    @abc.abstractmethod
    def collate_fn(self, split: str) -> Callable[[list[Any]], Any]:
        """The collate function of ``split``'s DataLoader."""

    # ---- the tokenizer

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer, built on first use."""
        if self._tokenizer is None:
            self._tokenizer = self._build_tokenizer()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer (the embedding table size a model needs)."""
        return self.tokenizer.get_vocab_size()

    @property
    def pad_token_id(self) -> int:
        """Id of the padding token."""
        return self._token_id(self.pad_token)

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:  # only reachable with a tokenizer object swapped in by hand
            raise ValueError(f"the tokenizer has no {token!r} token")
        return token_id

    # ---- datasets

    def dataset(self, split: str) -> Any:
        """The dataset of ``split`` ('train', 'val' or 'test'), built on first use."""
        split = resolve_split(split)
        if split not in self._datasets:
            self._datasets[split] = self._build_dataset(split)
        return self._datasets[split]

    # ---- Lightning hooks

    def prepare_data(self) -> None:
        """Read the corpus and train (or load) the cached tokenizer once, on the main process."""
        _ = self.tokenizer

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets of the splits the stage needs (all of them for an unknown stage)."""
        for name in STAGE_SPLITS.get(stage or "", SPLITS):
            self.dataset(name)

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (deterministic given the ``seed`` hyper-parameter)."""
        return self._loader("train", self.batch_size, shuffle=True, drop_last=self.hparams.drop_last)

    def val_dataloader(self) -> DataLoader:
        """Validation batches, in order."""
        return self._loader("val", self.eval_batch_size, shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches, in order."""
        return self._loader("test", self.eval_batch_size, shuffle=False, drop_last=False)

    def predict_dataloader(self) -> DataLoader:
        """Same batches as ``test_dataloader``."""
        return self.test_dataloader()

    # ---- loaders

    def _sampler(self, data: Dataset, shuffle: bool) -> Sampler[int]:
        """A shuffle seeded by the ``seed`` hyper-parameter and the epoch (same on every run and on resume), or in order."""
        return EpochShuffleSampler(data, seed=self.hparams.seed) if shuffle else SequentialSampler(data)

    def _worker_kwargs(self) -> dict[str, Any]:
        num_workers = self.hparams.num_workers
        return {"num_workers": num_workers, "persistent_workers": num_workers > 0}

    def _loader(self, split: str, batch_size: int, *, shuffle: bool, drop_last: bool) -> DataLoader:
        data = self.dataset(split)
        loader = ResumableDataLoader if shuffle else DataLoader  # training resumes mid-epoch in the same order
        return loader(data, batch_size=batch_size, sampler=self._sampler(data, shuffle), drop_last=drop_last,
                      collate_fn=self.collate_fn(split), **self._worker_kwargs())
