"""The built-in converters: ``nn.Linear``, ``nn.Embedding``, ``nn.MultiheadAttention``; the optional integrations declared.

Importing this module registers them (``comera_lightning.tensorize`` does). ``build_linear_like``
and the ``*_defaults`` functions are what a converter of a linear- or embedding-like type of
your own reuses (``integrations/hf.py`` is the worked example of docs/DESIGN_API.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from comera_lightning.layers import TTEmbedding, TTLinear, TTMultiheadAttention
from comera_lightning.tensorize.config import DEFAULT_EMBEDDING_RANK, TRAINED_TABLE_CORES, TensorizeConfig
from comera_lightning.tensorize.registry import Converter, register_converter, register_integration
from comera_lightning.tensorize.table_form import TOKEN_TABLE_CORES

__all__ = [
    "EBC_OPTIONS", "EMBEDDING_OPTIONS", "LINEAR_OPTIONS", "bag_defaults", "build_linear_like", "embedding_defaults", "linear_defaults",
    "no_converter_reason", "weight_std",
]


def linear_defaults(config: TensorizeConfig) -> dict[str, Any]:
    """Options of linear-like layers taken from the config (``max_rank`` None: ``rank_fraction`` of the smaller side)."""
    return {"max_rank": config.max_rank, "rank_fraction": config.rank_fraction, "num_cores": config.num_cores,
            "init": config.init, "gate_threshold": config.gate_threshold}


#: Cores of a table when ``embedding_num_cores`` is None: a token table as a two-core TT-matrix (chosen on the
#: quality race, docs/TUNING_QUALITY_RACE.md), a TorchRec table as four (TT-Rec's layout; its rows are millions) or,
#: from its trained weights (``init="svd"``), as two factors (``TRAINED_TABLE_CORES``): its truncated SVD is the best
#: start of its size, and a TT-matrix's split of the row index costs a trained table dear (docs/COMPRESS_CLASSIFIERS.md,
#: "A DLRM's tables"). A trained token table becomes two factors when they keep clearly more of it (``table_form.py``).
BAG_TABLE_CORES = 4


def _table_defaults(config: TensorizeConfig, cores: int, fallback_rank: int | None, trained_cores: int | None = None) -> dict[str, Any]:
    """A table's options: rank ``embedding_max_rank``, else ``max_rank``, else ``fallback_rank``; ``cores`` unless set
    (``trained_cores``, when given, with ``init="svd"``)."""
    cores = config.embedding_num_cores or (trained_cores if trained_cores and config.init == "svd" else cores)
    max_rank = next((r for r in (config.embedding_max_rank, config.max_rank) if r is not None), None)
    options = {"max_rank": max_rank, "num_cores": cores, "init": config.init, "gate_threshold": config.gate_threshold}
    if max_rank is None and cores == 1:  # two factors: a fraction of the width, like an nn.Embedding's
        options["rank_fraction"] = config.embedding_rank_fraction
    elif max_rank is None:
        options["max_rank"] = fallback_rank
    return options


def embedding_defaults(config: TensorizeConfig) -> dict[str, Any]:
    """Options of ``nn.Embedding`` tables (``max_rank`` None: ``embedding_rank_fraction`` of the embedding dim;
    ``num_cores`` None: decided from the trained table, ``table_form.token_table_cores``, when the layer is built)."""
    options = {**_table_defaults(config, TOKEN_TABLE_CORES, None), "rank_fraction": config.embedding_rank_fraction}
    if config.init == "svd" and config.embedding_num_cores is None:
        options["num_cores"] = None
    return options


def bag_defaults(config: TensorizeConfig) -> dict[str, Any]:
    """Options of TorchRec embedding-bag tables taken from the config (``max_rank`` None: 30 for TT-matrices,
    ``embedding_rank_fraction`` of the narrowest table's dim for two factors)."""
    return _table_defaults(config, BAG_TABLE_CORES, DEFAULT_EMBEDDING_RANK, TRAINED_TABLE_CORES)


def weight_std(weight: torch.Tensor) -> float | None:
    """Standard deviation of a weight's entries (None for a single entry, or on the meta device: sizes, no values)."""
    return float(weight.detach().float().std()) if weight.numel() > 1 and not weight.is_meta else None


def build_linear_like(cls: type[TTLinear], weight_in_out: torch.Tensor, bias: torch.Tensor | None, options: dict[str, Any]) -> TTLinear:
    """A ``cls`` (``TTLinear`` or a subclass) standing for ``y = x W + b`` with ``W`` given as ``(in, out)``."""
    init = options.pop("init")
    if init == "svd":
        return cls.from_weight(weight_in_out, bias, **options)
    std = None if init == "paper" else weight_std(weight_in_out.T)  # (out, in), reduced in nn.Linear's storage order
    in_features, out_features = weight_in_out.shape
    factory = {"device": weight_in_out.device, "dtype": weight_in_out.dtype}
    layer = cls(in_features, out_features, bias is not None, init_std=std, **factory, **options)
    if bias is not None:
        with torch.no_grad():
            layer.bias.copy_(bias)
    return layer


def _build_linear(module: nn.Linear, options: dict[str, Any]) -> TTLinear:
    return build_linear_like(TTLinear, module.weight.T, module.bias, options)


def _build_embedding(module: nn.Embedding, options: dict[str, Any]) -> TTEmbedding:
    init = options.pop("init")
    if init == "svd":
        return TTEmbedding.from_embedding(module, **options)
    w = module.weight
    std = 1.0 if init == "paper" else weight_std(w)
    std = 1.0 if std is None else std  # a single row, or the meta device (sizes, no values)
    return TTEmbedding(
        module.num_embeddings, module.embedding_dim, padding_idx=module.padding_idx, init_std=std, device=w.device, dtype=w.dtype, **options
    )


def _build_mha(module: nn.MultiheadAttention, options: dict[str, Any]) -> TTMultiheadAttention:
    """Each of the packed (or separate) q/k/v projections and ``out_proj`` becomes a ``TTLinear``."""
    if module._qkv_same_embed_dim:
        weights = module.in_proj_weight.chunk(3)  # (out, in) each
    else:
        weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
    biases = module.in_proj_bias.chunk(3) if module.in_proj_bias is not None else (None, None, None)
    q, k, v = (build_linear_like(TTLinear, w.T, b, dict(options)) for w, b in zip(weights, biases))
    out = build_linear_like(TTLinear, module.out_proj.weight.T, module.out_proj.bias, dict(options))
    return TTMultiheadAttention(q, k, v, out, module.num_heads, module.dropout, module.batch_first)


def _mha_unsupported(module: nn.MultiheadAttention) -> str | None:
    if module.bias_k is not None or module.add_zero_attn:
        return ("nn.MultiheadAttention with add_bias_kv or add_zero_attn is not supported: "
                "leave it dense (exclude_modules) or build it without those options")
    return None


def _linear_unsupported(module: nn.Linear) -> str | None:
    if isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
        return "the out_proj of an nn.MultiheadAttention: tensorized with its attention module, never alone"
    return None


def _embedding_unsupported(module: nn.Embedding) -> str | None:
    return "embedding with max_norm or sparse=True is not supported" if module.max_norm is not None or module.sparse else None


def no_converter_reason(module: nn.Module, shape: str) -> str:
    """What the report says of a module whose type has no converter but a large weight: why, and what to do."""
    if isinstance(module, nn.modules.conv._ConvNd):
        advice = ("convolutions have no TT form here, it stays dense (a ViT patch embedding or a Whisper front end is a "
                  "small share of the model); to tensorize one, register a Converter (docs/DESIGN_API.md, Extension points)")
    elif isinstance(module, nn.EmbeddingBag):
        advice = "use nn.Embedding, or TorchRec's EmbeddingBagCollection (tensorized once torchrec is imported)"
    else:
        advice = ("it stays dense; register a Converter for its type to tensorize it (docs/DESIGN_API.md, Extension points), "
                  "or name it in exclude_modules to leave it out of the report")
    return f"{type(module).__name__} with a {shape} weight has no TT converter: {advice}"


LINEAR_OPTIONS = frozenset({"max_rank", "rank_fraction", "num_cores", "in_modes", "out_modes", "init", "gate_threshold"})
EMBEDDING_OPTIONS = frozenset({"max_rank", "rank_fraction", "num_cores", "row_modes", "col_modes", "init", "gate_threshold", "deduplicate", "cache_rows", "lookup"})
EBC_OPTIONS = frozenset({"max_rank", "num_cores", "init", "gate_threshold", "deduplicate", "min_rows", "cache_rows", "lookup"})

register_converter(nn.Linear, Converter("linear", _build_linear, LINEAR_OPTIONS, linear_defaults, _linear_unsupported))
register_converter(nn.Embedding, Converter("embedding", _build_embedding, EMBEDDING_OPTIONS, embedding_defaults, _embedding_unsupported))
register_converter(nn.MultiheadAttention, Converter("mha", _build_mha, LINEAR_OPTIONS, linear_defaults, _mha_unsupported))
# Imported only once the program has imported their dependency (registry.converter_for loads them).
register_integration("torchrec", "comera_lightning.tensorize.integrations.torchrec", EBC_OPTIONS)
register_integration("transformers", "comera_lightning.tensorize.integrations.hf", LINEAR_OPTIONS)
