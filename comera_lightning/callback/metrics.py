"""What the callback logs: compression curves every logged step, a per-layer rank table per epoch (W&B)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from comera_lightning.rank import CompressionStats, active_size, compression_stats, tt_layers
from comera_lightning.schedule import STAGES

__all__ = ["compression_metrics", "log_rank_table", "publish_sizes", "rank_rows", "size_metrics", "write_rank_table"]

RANK_COLUMNS = ["layer", "ranks", "params", "dense_params", "compression"]


def size_metrics(module: nn.Module, stats: CompressionStats | None = None) -> dict[str, float]:
    """The model's size now (``stats``: its ``compression_stats``, when already taken): ``comera/compression_*``,
    ``comera/params_*`` and ``comera/layers_rank0``."""
    stats = stats if stats is not None else compression_stats(module)
    return {
        "comera/compression_model": stats.model_compression,
        "comera/compression_tt": stats.tt_compression,
        "comera/params_model": float(stats.model_parameters),
        "comera/params_tt": float(stats.tt_parameters),
        "comera/layers_rank0": float(sum(0 in layer.physical_ranks for _, layer in tt_layers(module))),
    }


def publish_sizes(trainer: pl.Trainer, module: nn.Module) -> None:
    """After a prune: the new sizes to every logger (W&B summary, CSV) and ``callback_metrics``, so the last values are the model's."""
    metrics = size_metrics(module)
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
    trainer.callback_metrics.update({key: torch.tensor(value) for key, value in metrics.items()})


def compression_metrics(module: nn.Module, stage: str, terms: Mapping[str, torch.Tensor], bond_ranks: bool | str) -> dict[str, Any]:
    """``comera/*`` metrics: compression and parameter counts, the stage, the objective's ``terms``, ranks.

    ``bond_ranks``: False logs no ranks; True or ``"layer"`` one ``comera/rank/<layer>`` series per TT
    layer (its bonds' mean active rank: a few dozen series for the paper model instead of ~180);
    ``"bond"`` one ``comera/rank/<layer>/<k>`` series per bond.
    """
    layers, stats = tt_layers(module), compression_stats(module)
    size = terms.get("active_size")
    size = active_size([m for _, m in layers]) if size is None else size
    metrics: dict[str, Any] = {
        **size_metrics(module, stats),
        "comera/stage": float(STAGES.index(stage)),
        "comera/params_tt_active": size,
        "comera/compression_tt_active": stats.dense_tt_parameters / size.clamp_min(1),
    }
    for key in ("size_surrogate", "lam", "task_loss"):
        if key in terms:
            metrics[f"comera/{key}"] = terms[key]
    if bond_ranks not in (False, True, "layer", "bond"):
        raise ValueError(f"log_bond_ranks must be true, false, 'layer' or 'bond', got {bond_ranks!r}.")
    for name, layer in layers if bond_ranks else ():
        ranks = [mask.sum().float() for mask in layer.gate_masks()]
        if bond_ranks == "bond":
            metrics.update({f"comera/rank/{name}/{k}": rank for k, rank in enumerate(ranks)})
        elif ranks:
            metrics[f"comera/rank/{name}"] = torch.stack(ranks).mean()
    return metrics


def log_rank_table(trainer: pl.Trainer) -> None:
    """A ``comera/ranks`` table (layer, ranks, parameters, compression) for every W&B logger of ``trainer``."""
    from lightning.pytorch.loggers import WandbLogger

    loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
    if not loggers or trainer.lightning_module is None:
        return
    rows = rank_rows(trainer.lightning_module)
    for lg in loggers:
        lg.log_table(key="comera/ranks", columns=RANK_COLUMNS, data=rows)


def rank_rows(module: nn.Module) -> list[list[Any]]:
    """Per TT layer: name, its bonds' active ranks, parameters now, dense parameters, compression."""
    return [[name, " ".join(str(r) for r in layer.ranks), layer.num_parameters(), layer.dense_parameters(),
             round(layer.compression_ratio(), 2)] for name, layer in tt_layers(module)]


def write_rank_table(trainer: pl.Trainer, module: nn.Module) -> str | None:
    """The final ranks as ``comera_ranks.csv`` in the Trainer's log folder; the file's path, or None (no logger)."""
    import csv
    import os

    folder = trainer.log_dir if trainer.loggers else None
    if not folder or not trainer.is_global_zero:
        return None
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "comera_ranks.csv")
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(RANK_COLUMNS)
        writer.writerows(rank_rows(module))
    return path
