"""Shared pieces of the click-log data modules: the batch type, KJT builders, table metadata.

A click log has, per sample, a float label (click or not), a few dense features and one bag
of categorical ids per sparse feature. A batch of them is a :class:`ClickBatch`, whose
``sparse`` field is a TorchRec ``KeyedJaggedTensor`` (one key per feature, in
``feature_names`` order, lengths key-major) that a TorchRec ``EmbeddingBagCollection`` or
``torchrec.models.dlrm.DLRM`` consumes directly.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor

from comera_lightning._optional import require

# TorchRec is an optional extra: without it, importing this module says how to install it.
_FEATURE = "The click-log data (comera_lightning.data.click_logs: ClickBatch, MovieLens, Criteo)"
EmbeddingBagConfig = require("torchrec.modules.embedding_configs", _FEATURE).EmbeddingBagConfig
KeyedJaggedTensor = require("torchrec.sparse.jagged_tensor", _FEATURE).KeyedJaggedTensor
TorchRecBatch = require("torchrec.datasets.utils", _FEATURE).Batch

__all__ = [
    "ClickBatch",
    "ClickCollate",
    "ClickSample",
    "ClickLogDataModule",
    "DatasetNotFoundError",
    "collate_click_samples",
    "embedding_bag_configs",
    "kjt_from_id_lists",
    "kjt_from_id_matrix",
    "positive_rate",
]


class DatasetNotFoundError(FileNotFoundError, ValueError):
    """A data file or folder is missing; the message says where it was looked for and how to fix it."""


class ClickBatch(TorchRecBatch):
    """One batch of click-log samples: TorchRec's own ``Batch`` (``Pipelineable``), with short field names.

    ``dense_features`` (alias ``dense``) is ``[B, num_dense]`` float32, ``sparse_features`` (alias
    ``sparse``) a ``KeyedJaggedTensor`` with one key per sparse feature and stride ``B``, ``labels``
    ``[B]`` float32 (1.0 = click). Being a ``torchrec.datasets.utils.Batch``, it goes straight into
    TorchRec's train pipelines (``TrainPipelineSparseDist``); Lightning moves it through :meth:`to`.
    Lightning cannot infer the batch size from the KJT: log with ``batch_size=batch.batch_size``.
    """

    def __init__(
        self,
        dense: Tensor | None = None,
        sparse: KeyedJaggedTensor | None = None,
        labels: Tensor | None = None,
        *,
        dense_features: Tensor | None = None,
        sparse_features: KeyedJaggedTensor | None = None,
    ) -> None:
        if labels is None:
            raise TypeError("ClickBatch needs 'labels'.")
        super().__init__(
            dense_features=_one_of(dense, dense_features, "dense"),
            sparse_features=_one_of(sparse, sparse_features, "sparse"),
            labels=labels,
        )

    dense = property(lambda self: self.dense_features, doc="The dense features ``[B, num_dense]``.")
    sparse = property(lambda self: self.sparse_features, doc="The sparse ids (a ``KeyedJaggedTensor``).")

    @property
    def batch_size(self) -> int:
        """Number of samples in the batch."""
        return int(self.labels.shape[0])

    def __len__(self) -> int:
        """Number of samples in the batch."""
        return self.batch_size

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClickBatch:
        """Return a copy with every tensor (and the KJT) on ``device``."""
        device = torch.device(device)
        return ClickBatch(
            self.dense.to(device=device, non_blocking=non_blocking),
            self.sparse.to(device=device, non_blocking=non_blocking),
            self.labels.to(device=device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> ClickBatch:
        """Return a copy in pinned host memory (used by ``DataLoader(pin_memory=True)``)."""
        return ClickBatch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())


def _one_of(short: Any, long: Any, name: str) -> Any:
    """The value given under either of a field's two names (both only when they are the same object)."""
    if short is None and long is None:
        raise TypeError(f"ClickBatch needs {name!r} (or {name}_features).")
    if short is not None and long is not None and short is not long:
        raise TypeError(f"ClickBatch got both {name!r} and {name}_features; pass one.")
    return short if short is not None else long


class ClickSample(NamedTuple):
    """One click-log sample: dense values, one id list per sparse feature, and the label."""

    dense: Sequence[float] | Tensor
    sparse: Sequence[Sequence[int]]
    label: float


def kjt_from_id_lists(
    feature_names: Sequence[str], ids: Sequence[Sequence[Sequence[int]]]
) -> KeyedJaggedTensor:
    """Build a KJT from ``ids[f][b]`` = the (possibly empty) id list of feature ``f``, sample ``b``."""
    if len(ids) != len(feature_names):
        raise ValueError(
            f"got id lists for {len(ids)} features but {len(feature_names)} feature names "
            f"{list(feature_names)}; pass one list of per-sample bags per feature."
        )
    batch = len(ids[0]) if ids else 0
    lengths: list[int] = []
    values: list[int] = []
    for name, bags in zip(feature_names, ids):
        if len(bags) != batch:
            raise ValueError(
                f"feature {name!r} has {len(bags)} bags but the batch has {batch} samples; "
                "every feature needs one bag (possibly empty) per sample."
            )
        for bag in bags:
            lengths.append(len(bag))
            values.extend(bag)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(feature_names),
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int32),
        stride=batch,
    )


def kjt_from_id_matrix(feature_names: Sequence[str], ids: Tensor) -> KeyedJaggedTensor:
    """Build a KJT with exactly one id per (sample, feature) from an integer ``[B, F]`` matrix."""
    if ids.dim() != 2 or ids.shape[1] != len(feature_names):
        raise ValueError(
            f"expected an id matrix of shape [batch, {len(feature_names)}], got {tuple(ids.shape)}."
        )
    batch = ids.shape[0]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(feature_names),
        values=ids.t().reshape(-1).to(torch.int64),
        lengths=torch.ones(ids.numel(), dtype=torch.int32),
        stride=batch,
    )


def collate_click_samples(samples: Sequence[ClickSample], feature_names: Sequence[str]) -> ClickBatch:
    """Collate :class:`ClickSample` s into a :class:`ClickBatch` (multi-id and empty bags allowed)."""
    if not samples:
        raise ValueError("cannot collate an empty list of click samples.")
    num_features = len(feature_names)
    for index, sample in enumerate(samples):
        if len(sample.sparse) != num_features:
            raise ValueError(
                f"sample {index} has {len(sample.sparse)} sparse bags, expected {num_features} "
                f"(one per feature in {list(feature_names)})."
            )
    per_feature = [[sample.sparse[f] for sample in samples] for f in range(num_features)]
    dense = torch.stack([torch.as_tensor(s.dense, dtype=torch.float32) for s in samples])
    labels = torch.tensor([float(s.label) for s in samples], dtype=torch.float32)
    return ClickBatch(dense=dense, sparse=kjt_from_id_lists(feature_names, per_feature), labels=labels)


class ClickCollate:
    """Picklable collate function (works in DataLoader workers) bound to ``feature_names``."""

    def __init__(self, feature_names: Sequence[str]) -> None:
        self.feature_names = list(feature_names)

    def __call__(self, samples: Sequence[ClickSample]) -> ClickBatch:
        """Collate a list of samples into a :class:`ClickBatch`."""
        return collate_click_samples(samples, self.feature_names)


def embedding_bag_configs(
    feature_names: Sequence[str], table_sizes: Sequence[int], embedding_dim: int
) -> list[EmbeddingBagConfig]:
    """One TorchRec ``EmbeddingBagConfig`` per feature (table ``t_<feature>``, sum pooling)."""
    if len(feature_names) != len(table_sizes):
        raise ValueError(
            f"{len(feature_names)} feature names but {len(table_sizes)} table sizes; "
            "give one table size per sparse feature."
        )
    if embedding_dim <= 0:
        raise ValueError(f"embedding_dim must be positive, got {embedding_dim}.")
    return [
        EmbeddingBagConfig(
            name=f"t_{name}",
            embedding_dim=embedding_dim,
            num_embeddings=int(size),
            feature_names=[name],
        )
        for name, size in zip(feature_names, table_sizes)
    ]


def positive_rate(labels: Tensor) -> float:
    """Fraction of positive labels (0.0 for an empty tensor)."""
    return float(labels.float().mean()) if labels.numel() else 0.0


class ClickLogDataModule(LightningDataModule, metaclass=abc.ABCMeta):
    """Base of the click-log data modules: the metadata a DLRM needs to build its tables.

    Subclasses provide ``feature_names`` (KJT keys, in order), ``table_sizes`` (rows per
    table, ids are in ``[0, size)``) and ``num_dense``. With LightningCLI, link them into the
    model with ``parser.link_arguments("data.table_sizes", "model.table_sizes",
    apply_on="instantiate")``; they are available right after construction.
    """

    @property
    @abc.abstractmethod
    def feature_names(self) -> list[str]:
        """Names of the sparse features, in KJT key order."""

    @property
    @abc.abstractmethod
    def table_sizes(self) -> list[int]:
        """Number of embedding rows per sparse feature, aligned with ``feature_names``."""

    @property
    @abc.abstractmethod
    def num_dense(self) -> int:
        """Number of dense features per sample."""

    def embedding_bag_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """TorchRec ``EmbeddingBagConfig`` s for this data, one table per sparse feature."""
        return embedding_bag_configs(self.feature_names, self.table_sizes, embedding_dim)

    def metadata(self) -> dict[str, Any]:
        """Feature names, table sizes and dense width as a plain dict (for logging/configs)."""
        return {
            "feature_names": self.feature_names,
            "table_sizes": self.table_sizes,
            "num_dense": self.num_dense,
        }
