"""One dense module turned into its tensorized layer: the converter's options, per-layer overrides, the rank cap."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from comera_lightning.layers import TensorizedModule
from comera_lightning.layers.interface import format_modes
from comera_lightning.layers.shapes import table_modes
from comera_lightning.tensorize.config import DEFAULT_EMBEDDING_RANK, TRAINED_TABLE_CORES, TensorizeConfig
from comera_lightning.tensorize.registry import Converter
from comera_lightning.tensorize.rules import overrides_for
from comera_lightning.tensorize.table_form import TOKEN_TABLE_CORES, token_table_cores

__all__ = ["aligned_rank", "build_layer", "pin_trained_tables", "resolve_rank", "resolve_table_cores"]

#: Ranks taken from a fraction round down to a multiple of this from ``ALIGNED_FROM`` on, in layers whose narrower
#: side is at least ``ALIGNED_SIDE`` (``aligned_rank``).
RANK_MULTIPLE = 8
ALIGNED_FROM = 64
ALIGNED_SIDE = 256


def build_layer(name: str, module: nn.Module, converter: Converter, config: TensorizeConfig,
                vocabulary_head: bool = False) -> TensorizedModule:
    """The tensorized layer for ``module`` (named ``name``): the converter's defaults, then ``layer_config``'s overrides."""
    overrides = overrides_for(name, config.layer_config or {})
    wrong = set(overrides) - converter.options
    if wrong:
        raise ValueError(
            f"layer_config keys {sorted(wrong)} do not apply to {name} ({type(module).__name__}); allowed: {sorted(converter.options)}."
        )
    defaults = converter.defaults(config)
    if vocabulary_head:
        defaults["rank_fraction"] = config.head_rank_fraction
    options = resolve_table_cores(resolve_rank({**defaults, **overrides}, module), module)
    try:
        built = converter.build(module, options)
    except ValueError as err:
        raise ValueError(f"cannot tensorize {name} ({type(module).__name__}): {err}") from err
    if vocabulary_head:
        built.vocabulary_layer = True  # its columns are tokens: its cores take longer steps (optim/core_steps.py)
    return built


def resolve_table_cores(options: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    """``num_cores`` None (a trained table whose layout is not given): ``token_table_cores`` of the module's weight at
    the resolved ``max_rank`` (row or column modes given: the TT-matrix they describe)."""
    if "num_cores" in options and options["num_cores"] is None:
        given_modes = options.get("row_modes") is not None or options.get("col_modes") is not None
        options["num_cores"] = TOKEN_TABLE_CORES if given_modes else token_table_cores(module.weight, options["max_rank"])
    return options


def resolve_rank(options: dict[str, Any], module: nn.Module) -> dict[str, Any]:
    """``max_rank`` None: ``rank_fraction`` of the smaller side of the module's weight (of a TorchRec collection: its
    narrowest table's dim; 30 without either)."""
    fraction = options.pop("rank_fraction", None)
    if options.get("max_rank") is None:
        weight = getattr(module, "weight", None)
        weight = weight if isinstance(weight, torch.Tensor) else getattr(module, "in_proj_weight", None)
        side = min(weight.shape[-2:]) if isinstance(weight, torch.Tensor) and weight.dim() >= 2 else _table_width(module)
        options["max_rank"] = aligned_rank(fraction * side, side) if side and fraction else DEFAULT_EMBEDDING_RANK
    return options


def aligned_rank(rank: float, side: int) -> int:
    """``rank`` rounded; from ``ALIGNED_FROM`` on, down to a multiple of ``RANK_MULTIPLE`` (down: a layer never grows
    past the size its fraction gives, so it keeps the compression it was chosen for). A GPU's fast GEMM kernels need
    rows of 16 bytes (8 bf16 values): on the H200 ranks of 222 and 333 ran cuBLAS's align-1 fallback kernels, and
    CoMERA's GEMMs took 2.7 times dense's time with fewer FLOPs (``benchmarks/results/h200/gpu_profile_*``). Smaller
    ranks, and the ranks of layers narrower than ``ALIGNED_SIDE``, stay as they are: their GEMMs are small, and
    rounding would cut their size by up to a tenth."""
    if rank < ALIGNED_FROM or side < ALIGNED_SIDE:
        return max(1, round(rank))
    return RANK_MULTIPLE * int(rank // RANK_MULTIPLE)


def _table_width(module: nn.Module) -> int | None:
    """The narrowest table's dim of a TorchRec collection (``embedding_bag_configs``), else None."""
    configs = module.embedding_bag_configs() if hasattr(module, "embedding_bag_configs") else []
    return min((c.embedding_dim for c in configs), default=None)


def pin_trained_tables(config: TensorizeConfig, swapped: Iterable[Any]) -> TensorizeConfig:
    """``config`` with what ``init`` decided written into ``layer_config``: the tables of ``swapped`` (a report's
    records) that ``init="svd"`` made two factors (every TorchRec collection, the token tables
    ``table_form.token_table_cores`` chose them for), at the ranks they started with, so that a checkpoint's record
    rebuilds the same layers under another ``init``."""
    if config.init != "svd" or config.embedding_num_cores is not None:
        return config
    given = config.layer_config or {}
    pins = {}
    for record in swapped:
        overrides = overrides_for(record.name, given)
        two_factors = record.kind == "ebc" or (record.kind == "embedding" and record.modes == _two_factor_modes(*record.shape))
        if two_factors and "num_cores" not in overrides:
            ranked = "max_rank" in overrides or config.embedding_max_rank is not None or config.max_rank is not None
            pins[record.name] = {**overrides, "num_cores": TRAINED_TABLE_CORES,
                                 **({} if ranked else {"max_rank": max(record.ranks)})}
    return config.replace(layer_config={**given, **pins}) if pins else config


def _two_factor_modes(rows: int, dim: int) -> str:
    """How a layer summary writes the modes of a ``rows`` × ``dim`` table as two factors."""
    return format_modes(*table_modes(rows, dim, TRAINED_TABLE_CORES, None, None), "×")
