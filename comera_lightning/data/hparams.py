"""Batch sizes read from a data module's ``self.hparams`` (what ``save_hyperparameters()`` stored)."""

from __future__ import annotations

from typing import Any

__all__ = ["BatchSizeHParams"]


class BatchSizeHParams:
    """``batch_size`` and ``eval_batch_size`` of a data module whose ``__init__`` saved its hyper-parameters.

    ``batch_size`` can be set (Lightning's batch-size finder does); ``eval_batch_size`` is the
    ``eval_batch_size`` hyper-parameter, or ``batch_size`` when that is None or absent.
    """

    hparams: Any  # provided by LightningDataModule

    @property
    def batch_size(self) -> int:
        """Training batch size."""
        return self.hparams.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.hparams.batch_size = value

    @property
    def eval_batch_size(self) -> int:
        """Validation/test batch size (``batch_size`` unless set)."""
        return self.hparams.get("eval_batch_size") or self.hparams.batch_size
