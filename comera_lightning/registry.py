"""The converter registry: which dense module types ``tensorize`` can turn into tensorized layers, and how.

A :class:`Converter` says how to build a :class:`~comera_lightning.layers.TensorizedModule` from a
dense module, which per-layer options (``layer_config`` keys) apply to it, and which options it
takes from the :class:`~comera_lightning.tensorize_config.TensorizeConfig`. ``register_converter``
adds one; an optional integration (TorchRec, Hugging Face) is declared with
``register_integration`` and imported only once the program has imported its dependency, so
looking a module up never imports a slow or missing package. docs/DESIGN.md has a worked example.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._optional import loaded
from .layers import TensorizedModule, TTEmbedding, TTLinear, TTMultiheadAttention

if TYPE_CHECKING:
    from .tensorize_config import TensorizeConfig

log = logging.getLogger(__name__)

__all__ = ["Converter", "converter_for", "known_options", "register_converter", "register_integration"]


@dataclass(frozen=True)
class Converter:
    """How one dense module type becomes a tensorized layer.

    ``build(module, options)`` returns the new layer; ``options`` holds ``defaults(config)``
    updated by the layer's ``layer_config`` overrides (only keys in ``options`` are allowed).
    ``unsupported(module)`` returns why a module of this type cannot be converted, or None.
    """

    kind: str
    build: Callable[[nn.Module, dict[str, Any]], TensorizedModule]
    options: frozenset[str]
    defaults: Callable[[TensorizeConfig], dict[str, Any]]
    unsupported: Callable[[nn.Module], str | None] = lambda module: None


@dataclass(frozen=True)
class _Integration:
    dependency: str  # top-level package that must already be imported
    module: str  # our module that registers the converters
    options: frozenset[str]


_CONVERTERS: dict[type, Converter] = {}
_INTEGRATIONS: list[_Integration] = []
_FAILED: set[str] = set()


def register_converter(dense_type: type[nn.Module], converter: Converter) -> None:
    """Make ``tensorize`` convert modules of ``dense_type`` (and its subclasses) with ``converter``."""
    if not (isinstance(dense_type, type) and issubclass(dense_type, nn.Module)):
        raise TypeError(f"dense_type must be an nn.Module subclass, got {dense_type!r}.")
    _CONVERTERS[dense_type] = converter


def register_integration(dependency: str, module: str, options: Iterable[str]) -> None:
    """Declare that ``module`` registers converters for types of the optional package ``dependency``."""
    _INTEGRATIONS.append(_Integration(dependency, module, frozenset(options)))


def _load_integrations() -> None:
    """Import the integrations whose dependency the program has imported (each once; a broken one is skipped)."""
    for integration in _INTEGRATIONS:
        if integration.module in sys.modules or integration.module in _FAILED or loaded(integration.dependency) is None:
            continue
        try:
            importlib.import_module(integration.module)
        except ImportError as err:  # e.g. a partly installed torchrec: plain layers must still tensorize
            _FAILED.add(integration.module)
            log.warning("comera_lightning: %s not loaded (%s); its layer types are not tensorized.", integration.module, err)


def converter_for(module: nn.Module) -> Converter | None:
    """The converter for ``module``'s type (the most specific registered base class), or None."""
    _load_integrations()
    for cls in type(module).__mro__:
        if cls in _CONVERTERS:
            return _CONVERTERS[cls]
    return None


def known_options() -> frozenset[str]:
    """Every per-layer option any registered or declared converter accepts."""
    names = set().union(*(c.options for c in _CONVERTERS.values()), *(i.options for i in _INTEGRATIONS))
    return frozenset(names)


# ---------------------------------------------------------------------- built-in converters
def linear_defaults(config: TensorizeConfig) -> dict[str, Any]:
    """Options of linear-like layers taken from the config."""
    return {"max_rank": config.max_rank, "num_cores": config.num_cores, "init": config.init, "gate_threshold": config.gate_threshold}


def embedding_defaults(config: TensorizeConfig) -> dict[str, Any]:
    """Options of embedding-like layers taken from the config."""
    max_rank = config.embedding_max_rank if config.embedding_max_rank is not None else config.max_rank
    return {"max_rank": max_rank, "num_cores": config.embedding_num_cores, "init": config.init, "gate_threshold": config.gate_threshold}


def weight_std(weight: torch.Tensor) -> float | None:
    """Standard deviation of a weight's entries (None for a single entry)."""
    return float(weight.detach().float().std()) if weight.numel() > 1 else None


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
    std = 1.0 if init == "paper" else float(w.detach().float().std())
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


LINEAR_OPTIONS = frozenset({"max_rank", "num_cores", "in_modes", "out_modes", "init", "gate_threshold"})
register_converter(nn.Linear, Converter("linear", _build_linear, LINEAR_OPTIONS, linear_defaults, _linear_unsupported))
register_converter(
    nn.Embedding,
    Converter(
        "embedding", _build_embedding, frozenset({"max_rank", "num_cores", "row_modes", "col_modes", "init", "gate_threshold", "deduplicate"}),
        embedding_defaults, _embedding_unsupported,
    ),
)
register_converter(nn.MultiheadAttention, Converter("mha", _build_mha, LINEAR_OPTIONS, linear_defaults, _mha_unsupported))
EBC_OPTIONS = frozenset({"max_rank", "num_cores", "init", "gate_threshold", "deduplicate", "min_rows"})
register_integration("torchrec", "comera_lightning.integrations.torchrec", EBC_OPTIONS)
register_integration("transformers", "comera_lightning.integrations.hf", LINEAR_OPTIONS)
