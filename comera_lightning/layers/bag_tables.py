"""The table configs of a ``TTEmbeddingBagCollection``: checks, dtypes, initial scale, small dense tables."""

from __future__ import annotations

import torch
from torch import nn

from comera_lightning._optional import require

_configs = require("torchrec.modules.embedding_configs", "TTEmbeddingBagCollection")
DataType, EmbeddingBagConfig, PoolingType = _configs.DataType, _configs.EmbeddingBagConfig, _configs.PoolingType

__all__ = ["concat", "config_dtype", "dense_table", "table_std", "validate_tables"]


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
