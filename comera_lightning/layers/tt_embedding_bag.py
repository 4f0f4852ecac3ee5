"""TTEmbeddingBagCollection: TorchRec's pooled embedding collection with TT-matrix tables (docs/METHOD.md §1.2).

A drop-in for ``torchrec.EmbeddingBagCollection`` (``KeyedJaggedTensor`` in, ``KeyedTensor``
out), so ``torchrec.models.dlrm.DLRM`` takes it as its sparse arch. Every table with at least
``min_rows`` rows is a :class:`TTEmbedding` (a ``TTModule``: the rank machinery gates, prunes
and resizes it on load like any other TT layer); smaller tables, where a tensor train saves
nothing, stay dense ``nn.Embedding`` weights pooled by the same code. Both live in the
``embedding_bags`` ``ModuleDict`` keyed by table name, the attribute name TorchRec uses.

Forward in training, per table: the ids of all its features are concatenated, deduplicated in
eager mode (and counted, for the hot rows), each distinct id is contracted once, and the bags are
pooled over those rows (``bag_pooling.py``: one gather for every feature when each bag holds one
id; plain torch, no fbgemm). On CUDA with Triton installed, a TT table's bags are pooled by one
fused kernel instead, forward and backward, with no deduplication and no rows in memory
(``kernels/``). At inference (eval, no autograd) all tables are served at once from one hot-row
cache (``bag_serving.py``). torchrec is optional: importing this module without it raises an
``ImportError`` saying how to install it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from comera_lightning._optional import loaded, require
from comera_lightning.layers.bag_pooling import gather_single_ids, pool_bags
from comera_lightning.layers.bag_serving import CollectionCache
from comera_lightning.layers.bag_tables import (EmbeddingBagConfig, PoolingType, check_feature_ids, concat, config_dtype, dense_table, table_std,
                                               validate_tables)
from comera_lightning.layers.inference_cache import caching_allowed
from comera_lightning.layers.interface import LayerSummary, TensorizedModule
from comera_lightning.layers.tt_embedding import TTEmbedding
from comera_lightning.layers.tt_rows import ids_are_checkable

_FEATURE = "TTEmbeddingBagCollection"
_modules = require("torchrec.modules.embedding_modules", _FEATURE)
_jagged = require("torchrec.sparse.jagged_tensor", _FEATURE)
EmbeddingBagCollection = _modules.EmbeddingBagCollection
EmbeddingBagCollectionInterface = _modules.EmbeddingBagCollectionInterface
get_embedding_names_by_table = _modules.get_embedding_names_by_table
KeyedJaggedTensor, KeyedTensor = _jagged.KeyedJaggedTensor, _jagged.KeyedTensor
# TensorDict input (newer torchrec) becomes a KJT; older torchrec takes KJTs only.
_tensor_dict = loaded("torchrec.sparse.tensor_dict")
maybe_td_to_kjt = _tensor_dict.maybe_td_to_kjt if _tensor_dict is not None else (lambda features, keys=None: features)

__all__ = ["TTEmbeddingBagCollection", "DEFAULT_MIN_ROWS"]

# Tables with fewer rows stay dense: their TT form would hardly be smaller and costs more compute.
DEFAULT_MIN_ROWS = 1000
INIT_CHOICES = ("svd", "random", "paper")


class TTEmbeddingBagCollection(EmbeddingBagCollectionInterface, TensorizedModule):
    """TorchRec ``EmbeddingBagCollection`` whose tables of ``>= min_rows`` rows are ``TTEmbedding`` trains.

    Same inputs, outputs, key order and ``length_per_key`` as ``EmbeddingBagCollection``;
    pooling ``SUM`` or ``MEAN`` per table (the mean of an empty bag is 0); with
    ``is_weighted=True`` the KJT weights multiply the rows before pooling (for ``MEAN`` tables
    the weighted sum is divided by the bag length, which TorchRec itself does not support).
    Tables below ``min_rows`` rows stay dense. ``max_rank``, ``num_cores`` and ``tt_kwargs``
    (``gate_threshold``, ``deduplicate``, ``init_std``, ...) go to every ``TTEmbedding``. Outputs
    are at least float32, like TorchRec's (float64 tables give float64).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        *,
        max_rank: int | Sequence[int],
        is_weighted: bool = False,
        num_cores: int = 3,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        min_rows: int = DEFAULT_MIN_ROWS,
        **tt_kwargs,
    ) -> None:
        super().__init__()
        tables = list(tables)
        validate_tables(tables)
        if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 0:
            raise ValueError(f"min_rows must be an integer >= 0, got {min_rows!r}.")
        tt_kwargs.setdefault("deduplicate", True)  # click logs repeat ids heavily: look each up once
        if "padding_idx" in tt_kwargs:
            raise ValueError("EmbeddingBagConfig tables have no padding_idx; drop the padding_idx argument.")
        self._is_weighted = bool(is_weighted)
        self._embedding_bag_configs = tables
        self.min_rows = min_rows
        self.embedding_bags = nn.ModuleDict()
        for config in tables:
            if not config.feature_names:
                config.feature_names = [config.name]  # as EmbeddingBagCollection does
            table_dtype = dtype or config_dtype(config)
            if config.num_embeddings < min_rows:
                self.embedding_bags[config.name] = dense_table(config, device, table_dtype)
            else:
                self.embedding_bags[config.name] = TTEmbedding(
                    config.num_embeddings, config.embedding_dim, max_rank=max_rank, num_cores=num_cores,
                    device=device, dtype=table_dtype, **tt_kwargs,
                )
        self._device = torch.device(device) if device is not None else next(self.parameters()).device
        self._feature_names: list[list[str]] = [list(config.feature_names) for config in tables]
        self._embedding_names: list[str] = [name for names in get_embedding_names_by_table(tables) for name in names]
        self._lengths_per_embedding: list[int] = [c.embedding_dim for c in tables for _ in c.feature_names]

    # ------------------------------------------------------------------ TorchRec interface
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The table configs, as ``EmbeddingBagCollection.embedding_bag_configs``."""
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        """Whether the input KJT carries per-id weights."""
        return self._is_weighted

    @property
    def device(self) -> torch.device:
        """The device the tables were built on."""
        return self._device

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool every feature's bags through its table; ``KeyedTensor`` of shape ``(B, Σ dims)``."""
        features = maybe_td_to_kjt(features, None)
        served = self._serve_hot_rows(features)
        if served is not None:
            return served
        position = {key: i for i, key in enumerate(features.keys())}
        missing = [f for names in self._feature_names for f in names if f not in position]
        if missing:
            raise ValueError(f"features {missing} are missing from the input KeyedJaggedTensor (keys: {features.keys()}).")
        weights = features.weights_or_none()
        if self._is_weighted and weights is None:
            raise ValueError("this collection is_weighted=True but the KeyedJaggedTensor has no weights.")
        value_offsets = features.offset_per_key()
        strides = features.stride_per_key()
        length_offsets = [0]
        for stride in strides:
            length_offsets.append(length_offsets[-1] + stride)

        keys_of = [[position[f] for f in names] for names in self._feature_names]
        per_feature = [[features.values()[value_offsets[i] : value_offsets[i + 1]] for i in keys] for keys in keys_of]
        check_feature_ids(self._embedding_bag_configs, self._feature_names, per_feature)
        table_ids = [concat(values) for values in per_feature]
        bag_weights = [concat([weights[value_offsets[i] : value_offsets[i + 1]] for i in keys]) if self._is_weighted else None
                       for keys in keys_of]
        lengths = [concat([features.lengths()[length_offsets[i] : length_offsets[i + 1]] for i in keys]).long() for keys in keys_of]
        fused = [self._fused_bags(*args) for args in zip(self._embedding_bag_configs, table_ids, lengths, bag_weights)]
        tables = [None if out is not None else self._table_rows(config, ids) for config, ids, out in zip(self._embedding_bag_configs, table_ids, fused)]
        values = None if any(out is not None for out in fused) else self._gather_single_ids(tables, lengths, bag_weights, features)
        if values is None:
            pooled: list[torch.Tensor] = []
            for config, keys, table, out, table_lengths, table_weights in zip(self._embedding_bag_configs, keys_of, tables, fused, lengths, bag_weights):
                if out is None:
                    out = pool_bags(*table, table_lengths, table_weights, mean=config.pooling == PoolingType.MEAN)
                out = out.to(torch.promote_types(out.dtype, torch.float32))
                pooled.extend(out.split([strides[i] for i in keys]) if len(keys) > 1 else [out])  # (a split's backward copies)
            values = torch.cat(self._expand_variable_batch(features, pooled), dim=1)
        return KeyedTensor(keys=self._embedding_names, values=values, length_per_key=self._lengths_per_embedding)

    def _fused_bags(self, config: EmbeddingBagConfig, ids: torch.Tensor, lengths: torch.Tensor,
                    weights: torch.Tensor | None) -> torch.Tensor | None:
        """A TT table's bags pooled by the fused kernel where it runs (CUDA, Triton: ``TTEmbedding.fused_bags``), else None."""
        table = self.embedding_bags[config.name]
        if not isinstance(table, TTEmbedding):
            return None
        return table.fused_bags(ids.long(), lengths, weights, mean=config.pooling == PoolingType.MEAN)

    def _gather_single_ids(self, tables: list[tuple[torch.Tensor, torch.Tensor]], lengths: list[torch.Tensor],
                           weights: list[torch.Tensor | None], features: KeyedJaggedTensor) -> torch.Tensor | None:
        """All features pooled in one gather where that applies (``bag_pooling.gather_single_ids``), else None."""
        if features.inverse_indices_or_none() is not None:  # (tables of unlike widths: gather_single_ids declines)
            return None
        return gather_single_ids(tables, lengths, weights if self._is_weighted else None, len(self._embedding_names))

    # ------------------------------------------------------------------ serving (eval, no autograd)
    def _serve_hot_rows(self, features: KeyedJaggedTensor) -> KeyedTensor | None:
        """All features at once from one cache of every table's hot rows (``bag_serving.py``); None where it does not apply."""
        if not caching_allowed(self.training) or self._is_weighted or features.inverse_indices_or_none() is not None:
            return None
        cache = self.__dict__.get("_collection_cache")
        modules = self.embedding_bags._modules  # (ModuleDict.__getitem__ per table costs more than the lookup at batch 1)
        tables = [modules[c.name] for c in self._embedding_bag_configs]
        if cache is None or not cache.valid_for(tables):
            if not CollectionCache.can_serve(tables):
                return None
            cache = CollectionCache(tables, self._embedding_bag_configs, self._feature_names)
            self.__dict__["_collection_cache"] = cache
        pooled = cache.serve(features.keys(), features.values(), features.lengths(), features.length_per_key(), features.stride())
        if pooled is None:
            return None
        return KeyedTensor(keys=self._embedding_names, values=pooled.to(torch.promote_types(pooled.dtype, torch.float32)),
                           length_per_key=self._lengths_per_embedding)

    def count_ids(self, features: KeyedJaggedTensor) -> None:
        """Count the ids of a batch towards each TT table's hot rows, without a training step."""
        per_key = features.to_dict()
        for config, names in zip(self._embedding_bag_configs, self._feature_names):
            table = self.embedding_bags[config.name]
            for name in [n for n in names if n in per_key and isinstance(table, TTEmbedding)]:
                table.count_ids(per_key[name].values())
        self.__dict__.pop("_collection_cache", None)

    def inference_bytes(self) -> int:
        """Bytes held for serving: every table's parameters, buffers and caches, and the collection's hot rows."""
        cache = self.__dict__.get("_collection_cache")
        dense = sum(t.numel() * t.element_size() for m in self.embedding_bags.values() if not isinstance(m, TTEmbedding) for t in m.parameters())
        return dense + sum(t.inference_bytes() for t in self.tt_tables().values()) + (cache.nbytes() if cache is not None else 0)

    def train(self, mode: bool = True) -> "TTEmbeddingBagCollection":
        if mode:  # training changes the tables: free the served rows now
            self.__dict__.pop("_collection_cache", None)
        return super().train(mode)

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state.pop("_collection_cache", None)  # weak references do not pickle; the cache is rebuilt anyway
        return state

    # ------------------------------------------------------------------ lookup and pooling
    def _table_rows(self, config: EmbeddingBagConfig, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, index)``: the rows one table pools from, and each id's row among them (its distinct ids, contracted once)."""
        table = self.embedding_bags[config.name]
        ids = ids.long()
        if not isinstance(table, TTEmbedding):
            return table.weight, ids
        if not ids.numel():  # all bags empty: look up one row anyway so the cores stay in the graph
            return table.lookup(ids.new_zeros(1)), ids
        if table.deduplicate and ids_are_checkable() and ids.numel() > 1 and not table.serves_hot_rows():
            unique, index, counts = torch.unique(ids, return_inverse=True, return_counts=True)
            if table.training:
                table.count_ids(unique, counts)
            return table.lookup(unique), index
        return table.rows(ids), torch.arange(ids.numel(), device=ids.device)  # hot rows at inference, or every id contracted

    def _expand_variable_batch(self, features: KeyedJaggedTensor, pooled: list[torch.Tensor]) -> list[torch.Tensor]:
        """With variable batch per feature, expand each feature's rows to the full batch by its inverse indices."""
        inverse = features.inverse_indices_or_none()
        if inverse is None:
            if len({t.shape[0] for t in pooled}) > 1:
                raise ValueError("the KeyedJaggedTensor has a variable batch size per feature but no inverse_indices.")
            return pooled
        row_of = {name: i for i, name in enumerate(inverse[0])}
        return [rows.index_select(0, inverse[1][row_of[name.split("@")[0]]]) for name, rows in zip(self._embedding_names, pooled)]

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_ebc(
        cls,
        ebc: EmbeddingBagCollection,
        *,
        max_rank: int | Sequence[int],
        init: str = "svd",
        num_cores: int = 3,
        min_rows: int = DEFAULT_MIN_ROWS,
        device: torch.device | str | None = None,
        **tt_kwargs,
    ) -> "TTEmbeddingBagCollection":
        """Tensorize a TorchRec ``EmbeddingBagCollection``; small tables are copied as they are.

        ``init``: ``"svd"`` (TT-SVD of each table, exact at full rank), ``"random"`` (random
        cores whose entries have each table's standard deviation) or ``"paper"`` (σ = 1,
        docs/METHOD.md §1.1).

        A collection built on the ``meta`` device (no memory: how a Criteo-scale model is
        declared) is tensorized without ever materialising its tables: the TT cores and the
        small dense tables are created on ``device`` (default CPU), initialised as TorchRec
        would (each table's ``init_fn``); ``init="svd"`` needs real values and is refused.
        """
        if not isinstance(ebc, EmbeddingBagCollection):
            raise TypeError(f"from_ebc expects a torchrec EmbeddingBagCollection, got {type(ebc).__name__}.")
        if init not in INIT_CHOICES:
            raise ValueError(f"init={init!r} is not supported; choose one of {INIT_CHOICES}.")
        configs = {c.name: c for c in ebc.embedding_bag_configs()}
        weights = {name: ebc.embedding_bags[name].weight for name in configs}
        dtypes = {w.dtype for w in weights.values()}
        first = next(iter(weights.values()))
        on_meta = first.device.type == "meta"
        if on_meta and init == "svd":
            raise ValueError(
                "the EmbeddingBagCollection is on the meta device, so it has no values to decompose (init='svd'): "
                "use init='random' or 'paper' to create fresh TT cores, or build the collection on a real device."
            )
        layer = cls(
            [dataclasses.replace(c, feature_names=list(c.feature_names)) for c in configs.values()],
            max_rank=max_rank, is_weighted=ebc.is_weighted(), num_cores=num_cores,
            device=device if device is not None else ("cpu" if on_meta else first.device),
            dtype=dtypes.pop() if len(dtypes) == 1 else None, min_rows=min_rows, **tt_kwargs,
        )
        with torch.no_grad():
            for name, table in layer.embedding_bags.items():
                weight = weights[name]
                if not isinstance(table, TTEmbedding):
                    if not on_meta:  # (from meta, the new table is already initialised like TorchRec's)
                        table.weight.copy_(weight)
                elif init == "svd":
                    table.load_table_(weight)
                else:
                    table.reset_cores(1.0 if init == "paper" else table_std(weight, configs[name]))
        return layer

    def to_ebc(self) -> EmbeddingBagCollection:
        """A TorchRec ``EmbeddingBagCollection`` holding the same tables (the dense export)."""
        configs = [dataclasses.replace(c, feature_names=list(c.feature_names)) for c in self._embedding_bag_configs]
        ebc = EmbeddingBagCollection(configs, is_weighted=self._is_weighted, device=self.device)
        for name, table in self.embedding_bags.items():
            weight = table.weight_table() if isinstance(table, TTEmbedding) else table.weight
            ebc.embedding_bags[name].weight = nn.Parameter(weight.detach().clone())
        return ebc

    def to_dense_module(self) -> EmbeddingBagCollection:
        """Same as ``to_ebc`` (used by ``comera_lightning.to_dense``)."""
        return self.to_ebc()

    # ------------------------------------------------------------------ sizes
    def tt_tables(self) -> dict[str, TTEmbedding]:
        """The tables stored as tensor trains, by name."""
        return {name: t for name, t in self.embedding_bags.items() if isinstance(t, TTEmbedding)}

    def dense_parameters(self) -> int:
        """Parameters of the equivalent ``EmbeddingBagCollection``."""
        return sum(c.num_embeddings * c.embedding_dim for c in self._embedding_bag_configs)

    def summary(self) -> LayerSummary:
        """Total rows, widest table, how many tables are TT, and the ranks of the largest TT table."""
        configs, tt_tables = self._embedding_bag_configs, self.tt_tables()
        largest = max(tt_tables.values(), key=lambda t: t.num_embeddings, default=None)
        return LayerSummary(
            "ebc", (sum(c.num_embeddings for c in configs), max(c.embedding_dim for c in configs)),
            f"{len(tt_tables)}/{len(configs)} tables TT", largest.physical_ranks if largest is not None else (),
        )

    def extra_repr(self) -> str:
        num_tt = len(self.tt_tables())
        return (
            f"tables={len(self._embedding_bag_configs)} ({num_tt} TT, {len(self.embedding_bags) - num_tt} dense "
            f"below min_rows={self.min_rows}), features={len(self._embedding_names)}, is_weighted={self._is_weighted}, "
            f"parameters={self.num_parameters():,} (dense {self.dense_parameters():,}, {self.compression_ratio():.1f}x)"
        )
