"""Swap chosen dense layers of a model for tensor-train layers in place, and back.

Rules (``target_modules`` / ``exclude_modules`` / ``layer_config`` keys):

* a **list** of strings: an entry matches a module whose full name equals it or ends with
  ``"." + entry`` (``"query"`` matches ``"encoder.layers.3.attention.query"``);
* a **string**: a regular expression that must match the whole module name;
* in ``layer_config`` keys, a key starting with ``"re:"`` is a regular expression.

By default every ``nn.Linear`` and ``nn.Embedding`` is a candidate, except output heads
(the model's last ``nn.Linear`` or one named like ``classifier``/``lm_head``), layers whose
weight is tied to another module, frozen layers and layers too small to gain. When torchrec
is in use, every ``EmbeddingBagCollection`` is a candidate too (→ ``TTEmbeddingBagCollection``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch
from torch import nn

from .layers import TTEmbedding, TTLinear, TTModule

__all__ = ["tensorize", "to_dense", "TensorizeReport", "SwapRecord", "ModuleRules"]

ModuleRules = Union[str, Sequence[str], None]

HEAD_NAMES = frozenset({"classifier", "lm_head", "head", "output_layer", "score", "fc_out", "logits", "predictions", "out_head"})
INIT_CHOICES = ("random", "paper", "svd")
_LINEAR_KEYS = {"max_rank", "num_cores", "in_modes", "out_modes", "init", "gate_threshold"}
_EMBEDDING_KEYS = {"max_rank", "num_cores", "row_modes", "col_modes", "init", "gate_threshold", "deduplicate"}
_EBC_KEYS = {"max_rank", "num_cores", "init", "gate_threshold", "deduplicate", "min_rows"}


@dataclass(frozen=True)
class SwapRecord:
    """One module that ``tensorize`` replaced."""

    name: str
    kind: str
    shape: tuple[int, int]
    modes: str
    ranks: tuple[int, ...]
    dense_parameters: int
    tt_parameters: int

    @property
    def compression(self) -> float:
        """Dense parameters over tensorized parameters for this layer."""
        return self.dense_parameters / max(1, self.tt_parameters)


@dataclass
class TensorizeReport:
    """What ``tensorize`` swapped, what it left alone and why, and the compression it gave."""

    swapped: list[SwapRecord] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    already_tensorized: list[str] = field(default_factory=list)
    model_parameters_before: int = 0
    model_parameters_after: int = 0

    @property
    def dense_parameters(self) -> int:
        """Parameters the swapped layers had."""
        return sum(r.dense_parameters for r in self.swapped)

    @property
    def tt_parameters(self) -> int:
        """Parameters the swapped layers have now."""
        return sum(r.tt_parameters for r in self.swapped)

    @property
    def layer_compression(self) -> float:
        """Compression of the swapped layers taken together."""
        return self.dense_parameters / max(1, self.tt_parameters)

    @property
    def model_compression(self) -> float:
        """Whole-model parameters before over after."""
        return self.model_parameters_before / max(1, self.model_parameters_after)

    def __str__(self) -> str:
        lines = [f"tensorize: {len(self.swapped)} swapped, {len(self.skipped)} skipped, {len(self.already_tensorized)} already tensorized"]
        for r in self.swapped:
            lines.append(
                f"  + {r.name:<48} {r.kind:<9} {r.shape[0]}x{r.shape[1]:<6} modes {r.modes:<22} ranks {list(r.ranks)} "
                f"{r.dense_parameters:>10,} -> {r.tt_parameters:>8,} ({r.compression:.1f}x)"
            )
        for name, reason in self.skipped:
            lines.append(f"  - {name:<48} {reason}")
        lines.append(
            f"  tensorized layers {self.dense_parameters:,} -> {self.tt_parameters:,} ({self.layer_compression:.1f}x); "
            f"whole model {self.model_parameters_before:,} -> {self.model_parameters_after:,} ({self.model_compression:.2f}x)"
        )
        return "\n".join(lines)


# ---------------------------------------------------------------------- rule matching
def _entry_matches(name: str, entry: str) -> bool:
    return name == entry or name.endswith("." + entry)


class _Rule:
    """A compiled ``target_modules``/``exclude_modules`` rule that remembers which parts were used."""

    def __init__(self, argument: str, rules: ModuleRules) -> None:
        self.argument = argument
        self.regex: re.Pattern | None = None
        self.entries: list[str] = []
        if isinstance(rules, str):
            try:
                self.regex = re.compile(rules)
            except re.error as err:
                raise ValueError(f"{argument}={rules!r} is not a valid regular expression: {err}.") from err
        elif rules is not None:
            if not isinstance(rules, Iterable) or not all(isinstance(e, str) and e for e in rules):
                raise TypeError(f"{argument} must be a regex string or a list of module names, got {rules!r}.")
            self.entries = list(rules)
        self.used: set[str] = set()

    def matches(self, name: str) -> bool:
        if self.regex is not None:
            hit = self.regex.fullmatch(name) is not None
            if hit:
                self.used.add(self.regex.pattern)
            return hit
        hits = [e for e in self.entries if _entry_matches(name, e)]
        self.used.update(hits)
        return bool(hits)

    def unused(self) -> list[str]:
        if self.regex is not None:
            return [] if self.used else [self.regex.pattern]
        return [e for e in self.entries if e not in self.used]


def _config_for(name: str, layer_config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key, overrides in layer_config.items():
        hit = re.fullmatch(key[3:], name) if key.startswith("re:") else _entry_matches(name, key)
        if hit:
            merged.update(overrides)
    return merged


def _validate_layer_config(layer_config: Mapping[str, Mapping[str, Any]]) -> None:
    allowed = _LINEAR_KEYS | _EMBEDDING_KEYS | _EBC_KEYS
    for key, overrides in layer_config.items():
        if not isinstance(overrides, Mapping):
            raise TypeError(f"layer_config[{key!r}] must be a mapping of overrides, got {overrides!r}.")
        unknown = set(overrides) - allowed
        if unknown:
            raise ValueError(f"layer_config[{key!r}] has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}.")
        if "init" in overrides and overrides["init"] not in INIT_CHOICES:
            raise ValueError(f"layer_config[{key!r}]['init']={overrides['init']!r}; choose one of {INIT_CHOICES}.")


# ---------------------------------------------------------------------- building TT layers
def _build_linear(module: nn.Linear, cfg: dict[str, Any]) -> TTLinear:
    init = cfg.pop("init")
    w = module.weight
    if init == "svd":
        return TTLinear.from_linear(module, **cfg)
    std = None if init == "paper" else float(w.detach().float().std()) if w.numel() > 1 else None
    layer = TTLinear(module.in_features, module.out_features, module.bias is not None, init_std=std, device=w.device, dtype=w.dtype, **cfg)
    if module.bias is not None:
        with torch.no_grad():
            layer.bias.copy_(module.bias)
    return layer


def _build_embedding(module: nn.Embedding, cfg: dict[str, Any]) -> TTEmbedding:
    init = cfg.pop("init")
    if init == "svd":
        return TTEmbedding.from_embedding(module, **cfg)
    w = module.weight
    std = 1.0 if init == "paper" else float(w.detach().float().std())
    return TTEmbedding(
        module.num_embeddings, module.embedding_dim, padding_idx=module.padding_idx, init_std=std, device=w.device, dtype=w.dtype, **cfg
    )


def _torchrec_types() -> tuple[type, ...]:
    """``(EmbeddingBagCollection, TTEmbeddingBagCollection)`` once torchrec is imported, else ``()``.

    A model holding either has imported torchrec already, so this never pays torchrec's slow import.
    """
    if sys.modules.get("torchrec") is None:
        return ()
    try:
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
    except ImportError:
        return ()
    from .layers.tt_embedding_bag import TTEmbeddingBagCollection

    return EmbeddingBagCollection, TTEmbeddingBagCollection


def _build_ebc(module: nn.Module, cfg: dict[str, Any]) -> nn.Module:
    from .layers.tt_embedding_bag import TTEmbeddingBagCollection

    return TTEmbeddingBagCollection.from_ebc(module, **cfg)


def _why_not(module: nn.Module, name: str, tied: dict[int, list[str]]) -> str | None:
    weight = getattr(module, "weight", None)
    if weight is None and not any(p.requires_grad for p in module.parameters()):
        return "frozen (no parameter requires grad)"
    if weight is not None and len(tied.get(id(weight), [])) > 1:
        others = [n for n in tied[id(weight)] if n != name]
        return f"weight is tied to {others}; untie it or exclude this module"
    if weight is not None and not weight.requires_grad:
        return "frozen (weight.requires_grad is False)"
    if isinstance(module, nn.Embedding) and (module.max_norm is not None or module.sparse):
        return "embedding with max_norm or sparse=True is not supported"
    return None


def _is_head(name: str, last_linear: str | None) -> bool:
    return name == last_linear or name.rsplit(".", 1)[-1] in HEAD_NAMES


# ---------------------------------------------------------------------- public API
def tensorize(
    model: nn.Module,
    *,
    target_modules: ModuleRules = None,
    exclude_modules: ModuleRules = None,
    max_rank: int | Sequence[int] = 30,
    embedding_max_rank: int | Sequence[int] | None = None,
    num_cores: int | Sequence[int] = 3,
    embedding_num_cores: int = 4,
    init: str = "random",
    layer_config: Mapping[str, Mapping[str, Any]] | None = None,
    min_compression: float = 2.0,
    gate_threshold: float = 1e-2,
) -> TensorizeReport:
    """Replace matching ``nn.Linear``/``nn.Embedding`` modules of ``model`` by TT layers, in place.

    ``init``: ``"random"`` (variance matched to the layer being replaced), ``"paper"``
    (METHOD §1.1: σ² = 1/(d_in+d_out) for linear, σ = 1 for embeddings) or ``"svd"`` (TT-SVD of
    the current weights, for pretrained models). ``layer_config`` maps a rule to per-layer
    overrides (``max_rank``, ``num_cores``, modes, ``init``, ...). Layers whose compression would
    be below ``min_compression`` are skipped. Already tensorized layers are left as they are, so
    calling it twice is harmless. Raises ``ValueError`` when the rules match no module.
    """
    if init not in INIT_CHOICES:
        raise ValueError(f"init={init!r} is not supported; choose one of {INIT_CHOICES}.")
    if not isinstance(min_compression, (int, float)) or min_compression < 0:
        raise ValueError(f"min_compression must be a number >= 0, got {min_compression!r}.")
    layer_config = dict(layer_config or {})
    _validate_layer_config(layer_config)
    targets = _Rule("target_modules", target_modules)
    excludes = _Rule("exclude_modules", exclude_modules)
    explicit_targets = target_modules is not None

    names_of: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names_of.setdefault(id(module), []).append(name)
    tied: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter):
            tied.setdefault(id(weight), []).append(name)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    last_linear = linears[-1] if len(linears) > 1 else None
    torchrec_types = _torchrec_types()
    candidates = (nn.Linear, nn.Embedding, *torchrec_types[:1])
    inside_collection: list[str] = []  # a TTEmbeddingBagCollection's tables are its own business

    report = TensorizeReport(model_parameters_before=_count_parameters(model))
    swaps: list[tuple[nn.Module, nn.Module, SwapRecord]] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(prefix) for prefix in inside_collection):
            continue
        if isinstance(module, (TTModule, *torchrec_types[1:])):
            if not isinstance(module, TTModule):
                inside_collection.append(name + ".")
            if not explicit_targets or targets.matches(name):
                report.already_tensorized.append(name)
            continue
        if not isinstance(module, candidates):
            continue
        if explicit_targets and not targets.matches(name):
            continue
        if excludes.matches(name):
            report.skipped.append((name, "excluded by exclude_modules"))
            continue
        if not explicit_targets and _is_head(name, last_linear):
            report.skipped.append((name, "output head; name it in target_modules to tensorize it"))
            continue
        reason = _why_not(module, name, tied)
        if reason:
            report.skipped.append((name, reason))
            continue
        built = _build(module, name, layer_config, max_rank, embedding_max_rank, num_cores, embedding_num_cores, init, gate_threshold)
        if built.compression_ratio() < min_compression:
            report.skipped.append((name, f"too small to gain ({built.compression_ratio():.2f}x < min_compression={min_compression})"))
            continue
        swaps.append((module, built, _record(name, module, built)))

    for rule in (targets, excludes):
        if rule.unused():
            raise ValueError(
                f"{rule.argument} entries {rule.unused()} match no module of {type(model).__name__}; "
                f"module names look like {linears[:3] or [n for n, _ in model.named_modules()][1:4]}."
            )
    if not swaps and not report.already_tensorized:
        raise ValueError(
            f"tensorize found nothing to swap in {type(model).__name__} with target_modules={target_modules!r}, "
            f"exclude_modules={exclude_modules!r}; skipped: {report.skipped or 'no nn.Linear/nn.Embedding/EmbeddingBagCollection found'}."
        )
    for old, new, record in swaps:
        new.train(old.training)
        _replace_everywhere(model, names_of[id(old)], new)
        report.swapped.append(record)
    report.model_parameters_after = _count_parameters(model)
    return report


def to_dense(model: nn.Module) -> list[str]:
    """Replace every TT layer of ``model`` by the equivalent dense module, in place; returns their names."""
    names_of: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names_of.setdefault(id(module), []).append(name)
    converted: list[str] = []
    tt_types = (TTModule, *_torchrec_types()[1:])
    for name, module in list(model.named_modules()):
        if any(name.startswith(done + ".") for done in converted):
            continue  # already exported with its parent collection
        if isinstance(module, tt_types):
            dense = module.to_dense_module()
            dense.train(module.training)
            _replace_everywhere(model, names_of[id(module)], dense)
            converted.append(name)
    return converted


# ---------------------------------------------------------------------- helpers
def _build(module, name, layer_config, max_rank, embedding_max_rank, num_cores, embedding_num_cores, init, gate_threshold) -> nn.Module:
    overrides = _config_for(name, layer_config)
    if isinstance(module, nn.Linear):
        cfg = {"max_rank": max_rank, "num_cores": num_cores, "init": init, "gate_threshold": gate_threshold}
        allowed, build = _LINEAR_KEYS, _build_linear
    else:
        cfg = {
            "max_rank": embedding_max_rank if embedding_max_rank is not None else max_rank,
            "num_cores": embedding_num_cores, "init": init, "gate_threshold": gate_threshold,
        }
        allowed, build = (_EMBEDDING_KEYS, _build_embedding) if isinstance(module, nn.Embedding) else (_EBC_KEYS, _build_ebc)
    wrong = set(overrides) - allowed
    if wrong:
        raise ValueError(f"layer_config keys {sorted(wrong)} do not apply to {name} ({type(module).__name__}); allowed: {sorted(allowed)}.")
    cfg.update(overrides)
    try:
        return build(module, cfg)
    except ValueError as err:
        raise ValueError(f"cannot tensorize {name} ({type(module).__name__}): {err}") from err


def _record(name: str, module: nn.Module, built: nn.Module) -> SwapRecord:
    if isinstance(built, TTLinear):
        kind, shape, ranks = "linear", (built.in_features, built.out_features), built.physical_ranks
        modes = "·".join(map(str, built.in_modes)) + "→" + "·".join(map(str, built.out_modes))
    elif isinstance(built, TTEmbedding):
        kind, shape, ranks = "embedding", (built.num_embeddings, built.embedding_dim), built.physical_ranks
        modes = "·".join(map(str, built.row_modes)) + "×" + "·".join(map(str, built.col_modes))
    else:  # TTEmbeddingBagCollection: total rows, widest table, ranks of the largest TT table
        configs, tt_tables = built.embedding_bag_configs(), built.tt_tables()
        kind, shape = "ebc", (sum(c.num_embeddings for c in configs), max(c.embedding_dim for c in configs))
        modes = f"{len(tt_tables)}/{len(configs)} tables TT"
        largest = max(tt_tables.values(), key=lambda t: t.num_embeddings, default=None)
        ranks = largest.physical_ranks if largest is not None else ()
    dense = sum(p.numel() for p in module.parameters())
    return SwapRecord(name, kind, shape, modes, ranks, dense, built.num_parameters())


def _replace_everywhere(model: nn.Module, names: list[str], new: nn.Module) -> None:
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)


def _count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
