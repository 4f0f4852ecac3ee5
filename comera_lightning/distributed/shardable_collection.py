"""A TT embedding collection ready for ``DistributedModelParallel``: TT tables replicated, dense tables in a TorchRec EBC.

``TTEmbeddingBagCollection`` keeps its small tables as plain ``nn.Embedding`` weights, which DMP
would replicate. :func:`make_shardable` moves them into a real TorchRec ``EmbeddingBagCollection``
child (``sharded_tables``), which TorchRec's planner shards; the TT tables stay where they were
(data parallel, pruned by ``ComeraCallback`` like any other TT layer). State-dict hooks keep the
keys of the unsharded collection, so checkpoints move freely between DMP and plain runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from comera_lightning.layers.tt_embedding_bag import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    KeyedTensor,
    TTEmbeddingBagCollection,
    maybe_td_to_kjt,
)

__all__ = ["ShardableEmbeddingBagCollection", "make_shardable"]

_SHARDED = "sharded_tables.embedding_bags."
_PLAIN = "embedding_bags."


class ShardableEmbeddingBagCollection(TTEmbeddingBagCollection):
    """The TT tables of a ``TTEmbeddingBagCollection``, plus its dense tables as a TorchRec ``EmbeddingBagCollection``.

    Same inputs, outputs and ``embedding_bag_configs()`` as the collection it was made from; its
    ``state_dict`` has the same keys. Build it with :meth:`from_tt_collection` (the TT modules are
    moved, not copied, so the callback's references to them stay valid).
    """

    def __init__(self, collection: TTEmbeddingBagCollection) -> None:
        tt_tables = collection.tt_tables()
        configs = collection.embedding_bag_configs()
        tt_configs = [_copy(c) for c in configs if c.name in tt_tables]
        super().__init__(tt_configs, max_rank=1, is_weighted=collection.is_weighted(), device="meta", min_rows=0)
        for name, table in tt_tables.items():
            self.embedding_bags[name] = table  # the live TT modules, not the meta placeholders
        self._device = collection.device
        self.min_rows = collection.min_rows
        self._all_configs = list(configs)
        self._all_embedding_names = [n for c in configs for n in c.feature_names]
        self._all_lengths = [c.embedding_dim for c in configs for _ in c.feature_names]
        dense_configs = [_copy(c) for c in configs if c.name not in tt_tables]
        self.sharded_tables = EmbeddingBagCollection(dense_configs, is_weighted=collection.is_weighted(), device=collection.device)
        with torch.no_grad():
            for config in dense_configs:
                self.sharded_tables.embedding_bags[config.name].weight.copy_(collection.embedding_bags[config.name].weight)
        self._tt_keys = [f for c in tt_configs for f in c.feature_names]
        self._dense_keys = [f for c in dense_configs for f in c.feature_names]
        self.tt_lookup = _TTLookup(self)
        self._register_state_dict_hook(_rename_keys(_SHARDED, _PLAIN))
        self._register_load_state_dict_pre_hook(_rename_loaded_keys(set(t.name for t in dense_configs)), with_module=True)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """All table configs, TT and dense, in the original order."""
        return self._all_configs

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """TT features through the TT tables, the rest through the (sharded) TorchRec collection; one ``KeyedTensor``.

        The sharded collection takes the batch's KJT as it is (it picks its own features), and the
        TT lookup is a leaf module: so ``torch.fx`` traces this forward, and TorchRec's train
        pipelines can start the sharded tables' input all-to-all before the forward runs.
        """
        return _merge_pooled(self.tt_lookup(features), self.sharded_tables(features), self._all_embedding_names)

    def _tt_forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """The TT tables' pooled embeddings (the input's other features ignored)."""
        features = maybe_td_to_kjt(features, None)
        position = {key: i for i, key in enumerate(features.keys())}
        missing = [f for f in self._tt_keys + self._dense_keys if f not in position]
        if missing:
            raise ValueError(f"features {missing} are missing from the input KeyedJaggedTensor (keys: {features.keys()}).")
        tt_input = features.permute([position[f] for f in self._tt_keys])
        return super().forward(tt_input)

    def dense_parameters(self) -> int:
        """Parameters of the equivalent ``EmbeddingBagCollection`` (all tables)."""
        return sum(c.num_embeddings * c.embedding_dim for c in self._all_configs)

    def num_parameters(self) -> int:
        """TT parameters plus the whole dense tables (not this rank's shards: the same on every rank)."""
        dense = sum(c.num_embeddings * c.embedding_dim for c in self.sharded_tables.embedding_bag_configs())
        return sum(p.numel() for p in self.embedding_bags.parameters()) + dense

    def to_ebc(self) -> EmbeddingBagCollection:
        """Refused: the dense tables may be spread over ranks."""
        raise RuntimeError(
            "a ShardableEmbeddingBagCollection (made for DistributedModelParallel) cannot be exported directly: load "
            "the checkpoint into the unsharded model (its keys are the same) and export that."
        )


class _TTLookup(nn.Module):
    """Calls its collection's TT lookup; holds no parameters, so ``torch.fx`` keeps it as one call (a leaf)."""

    def __init__(self, owner: ShardableEmbeddingBagCollection) -> None:
        super().__init__()
        self.__dict__["_owner"] = owner  # not a submodule: no second path to the TT parameters

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self._owner._tt_forward(features)


def _merge_pooled(tt: KeyedTensor, dense: KeyedTensor, names: list[str]) -> KeyedTensor:
    """One KeyedTensor of both lookups' embeddings, in the order ``names`` (a single ``torch.fx`` call)."""
    pooled = {**tt.to_dict(), **dense.to_dict()}
    return KeyedTensor.from_tensor_list(names, [pooled[name] for name in names])


torch.fx.wrap("_merge_pooled")


def make_shardable(module: nn.Module) -> list[str]:
    """Replace every ``TTEmbeddingBagCollection`` under ``module`` so DMP can shard its dense tables; names changed.

    A collection without dense tables is left alone (nothing to shard); one without TT tables becomes
    a plain TorchRec ``EmbeddingBagCollection`` (same keys).
    """
    changed = []
    for name, child in list(module.named_modules()):
        if type(child) is not TTEmbeddingBagCollection:
            continue
        tt_count, total = len(child.tt_tables()), len(child.embedding_bag_configs())
        if tt_count == total:
            continue
        replacement = child.to_ebc() if tt_count == 0 else ShardableEmbeddingBagCollection(child)
        parent_name, _, attribute = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, attribute, replacement)
        changed.append(name)
    return changed


def _copy(config: EmbeddingBagConfig) -> EmbeddingBagConfig:
    return dataclasses.replace(config, feature_names=list(config.feature_names))


def _rename_keys(old: str, new: str) -> Callable:
    """A state-dict hook writing ``prefix+old…`` keys as ``prefix+new…`` (order kept)."""

    def hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        for key in [k for k in state_dict if k.startswith(prefix + old)]:
            state_dict[prefix + new + key[len(prefix + old):]] = state_dict.pop(key)

    return hook


def _rename_loaded_keys(dense_tables: set[str]) -> Callable:
    """A load pre-hook sending the dense tables' plain keys to ``sharded_tables``."""

    def hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
        for key in [k for k in state_dict if k.startswith(prefix + _PLAIN)]:
            if key[len(prefix + _PLAIN):].split(".", 1)[0] in dense_tables:
                state_dict[prefix + _SHARDED + key[len(prefix + _PLAIN):]] = state_dict.pop(key)

    return hook
