"""The table configs of a ``TTEmbeddingBagCollection``: checks, dtypes, initial scale, small dense tables."""

from __future__ import annotations

import torch
from torch import nn

from comera_lightning._optional import require
from comera_lightning.layers.tt_rows import ids_are_checkable

_configs = require("torchrec.modules.embedding_configs", "TTEmbeddingBagCollection")
DataType, EmbeddingBagConfig, PoolingType = _configs.DataType, _configs.EmbeddingBagConfig, _configs.PoolingType

__all__ = ["check_feature_ids", "concat", "config_dtype", "dense_table", "table_std", "validate_tables"]


def config_dtype(config: EmbeddingBagConfig) -> torch.dtype:
    """The dtype TorchRec's ``EmbeddingBagCollection`` gives a table."""
    return torch.float32 if config.data_type == DataType.FP32 else torch.float16


def concat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def validate_tables(tables: list[EmbeddingBagConfig]) -> None:
    if not tables:
        raise ValueError("TTEmbeddingBagCollection needs at least one EmbeddingBagConfig, got none.")
    names = set()
    for config in tables:
        if not isinstance(config, EmbeddingBagConfig):
            raise TypeError(f"tables must be torchrec EmbeddingBagConfig objects, got {type(config).__name__}.")
        if config.name in names:
            raise ValueError(f"duplicate table name {config.name!r}; every table needs its own name.")
        names.add(config.name)
        if config.pooling not in (PoolingType.SUM, PoolingType.MEAN):
            raise ValueError(f"table {config.name!r} has pooling {config.pooling}; only PoolingType.SUM and MEAN are supported.")


def table_std(weight: torch.Tensor, config: EmbeddingBagConfig) -> float:
    """Standard deviation of a table's entries; for a meta table, of its ``init_fn`` on a sample of rows."""
    if weight.device.type == "meta":
        if config.init_fn is None:
            return 1.0
        weight = torch.empty(min(weight.shape[0], 4096), weight.shape[1], dtype=torch.float32)
        config.init_fn(weight)
    return float(weight.float().std()) if weight.numel() > 1 else 1.0


def dense_table(config: EmbeddingBagConfig, device: torch.device | str | None, dtype: torch.dtype) -> nn.Embedding:
    """A small table kept dense, initialised like TorchRec initialises it."""
    table = nn.Embedding(config.num_embeddings, config.embedding_dim, device=device, dtype=dtype)
    if config.init_fn is not None and table.weight.device.type != "meta":
        with torch.no_grad():
            config.init_fn(table.weight)
    return table


def check_feature_ids(tables: list[EmbeddingBagConfig], feature_names: list[list[str]], per_feature: list[list[torch.Tensor]]) -> None:
    """Raise naming table, feature and id when an id is outside its table (one host sync, eager only)."""
    checks = [
        (config, name, values)
        for config, names, table_values in zip(tables, feature_names, per_feature)
        for name, values in zip(names, table_values)
    ]
    for config, name, values in checks:
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"ids of feature {name!r} (table {config.name!r}) must be integers, got dtype {values.dtype}.")
    if not ids_are_checkable():
        return
    bad = [((values < 0) | (values >= config.num_embeddings)).any() for config, _, values in checks]
    if not bool(torch.stack(bad).any()):
        return
    for config, name, values in checks:
        wrong = values[(values < 0) | (values >= config.num_embeddings)]
        if wrong.numel():
            raise IndexError(
                f"id {int(wrong[0])} of feature {name!r} is out of range for table {config.name!r} "
                f"with {config.num_embeddings} rows (valid ids: 0..{config.num_embeddings - 1})."
            )
