"""Swap chosen dense layers of a model for tensorized layers in place (``tensorize``), and back (``to_dense``).

Which layers: the rules of :class:`~comera_lightning.tensorize.config.TensorizeConfig`
(``comera_lightning.tensorize.rules`` says how names match). By default every module whose type has
a converter in ``comera_lightning.tensorize.registry`` is a candidate (``nn.Linear``, ``nn.Embedding``, and
with torchrec in use ``EmbeddingBagCollection``), except classifier heads (``heads.py`` finds heads by name,
vocabulary, class count or structure; a head to a vocabulary is tensorized with ``include_heads``), attention
projections (``include_attention``), layers whose weight is tied to another module, frozen layers and
layers too small to gain. The returned report lists what was swapped,
what was skipped and why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from comera_lightning.layers import TensorizedModule
from comera_lightning.layers.hot_rows import keep_id_counts_local
from comera_lightning.rank import compression_stats
from comera_lightning.tensorize.attention import attention_blocks
from comera_lightning.tensorize.build import build_layer
from comera_lightning.tensorize.config import INIT_CHOICES, ModuleRules, TensorizeConfig
from comera_lightning.tensorize.converters import no_converter_reason  # importing it registers the built-in converters
from comera_lightning.tensorize.heads import output_heads, widens
from comera_lightning.tensorize.registry import Converter, converter_for
from comera_lightning.tensorize.rules import Rule, RuleMatchError, unmatched_error

__all__ = [
    "tensorize", "to_dense", "check_rules", "tensorizable_names", "TensorizeConfig", "TensorizeReport", "SwapRecord", "ModuleRules",
    "INIT_CHOICES", "RuleMatchError", "planned_sizes", "skipped_layers",
]

#: A module of an unhandled type with a weight of at least this many entries is reported as skipped.
LARGE_WEIGHT = 4096
log = logging.getLogger(__name__)


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
    #: The TT parts alone (a collection may keep some tables dense), as ``comera/compression_tt`` counts them.
    tt_part_dense_parameters: int = 0
    tt_part_parameters: int = 0

    @classmethod
    def of(cls, name: str, dense: nn.Module, built: TensorizedModule) -> SwapRecord:
        """The record of ``dense`` (named ``name``) replaced by ``built``."""
        summary = built.summary()
        dense_parameters = sum(p.numel() for p in dense.parameters())
        parts = compression_stats(built)
        return cls(name, summary.kind, summary.shape, summary.modes, summary.ranks, dense_parameters, built.num_parameters(),
                   parts.dense_tt_parameters, parts.tt_parameters)

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
        part_dense = sum(r.tt_part_dense_parameters for r in self.swapped)
        part_tt = sum(r.tt_part_parameters for r in self.swapped)
        if (part_dense, part_tt) != (self.dense_parameters, self.tt_parameters):  # some tables stayed dense
            lines.append(f"  their TT parts alone {part_dense:,} -> {part_tt:,} ({part_dense / max(1, part_tt):.1f}x, logged as comera/compression_tt)")
        return "\n".join(lines)


# ---------------------------------------------------------------------- public API
def tensorize(model: nn.Module, config: TensorizeConfig | Mapping[str, Any] | None = None, **options: Any) -> TensorizeReport:
    """Replace ``model``'s matching dense layers by tensorized ones, in place; return what happened.

    ``config`` (default ``TensorizeConfig()``) says which layers and how; keyword ``options``
    (``max_rank=16``, ``target_modules=[...]``, ...) override its fields. Already tensorized
    layers are left as they are, so calling it twice is harmless. Raises ``RuleMatchError``
    (a ``ValueError``) when a rule matches no module, ``ValueError`` when nothing could be swapped.
    """
    if isinstance(config, Mapping):  # e.g. the settings a checkpoint records
        config = TensorizeConfig.from_dict(config)
    config = (config if config is not None else TensorizeConfig()).replace(**options)
    targets = Rule("target_modules", config.target_modules)
    excludes = Rule("exclude_modules", config.exclude_modules)
    scan = _ModelScan.of(model)
    report = TensorizeReport(model_parameters_before=_count_parameters(model))
    swaps = _plan(model, config, scan, targets, excludes, report)
    for rule in (targets, excludes):
        if rule.unused():
            raise unmatched_error(rule, type(model).__name__, tensorizable_names(model))
    if not swaps and not report.already_tensorized:
        raise ValueError(
            f"tensorize found nothing to swap in {type(model).__name__} with target_modules={config.target_modules!r}, "
            f"exclude_modules={config.exclude_modules!r}; skipped: {report.skipped or 'no layer of a supported type found'}."
        )
    for old, new, record in swaps:
        new.train(old.training)
        _replace_everywhere(model, scan.names_of[id(old)], new)
        report.swapped.append(record)
    keep_id_counts_local(model)
    report.model_parameters_after = _count_parameters(model)
    return report


def check_rules(model: nn.Module, config: TensorizeConfig | None = None) -> None:
    """Raise :class:`RuleMatchError` for a ``target_modules`` / ``exclude_modules`` entry that names no module of ``model``.

    Cheap (nothing is built or changed), to catch a typo before training; ``tensorize`` itself also
    refuses an entry that names only modules it cannot swap.
    """
    config = config or TensorizeConfig()
    names = [name for name, _ in model.named_modules() if name]
    for rule in (Rule("target_modules", config.target_modules), Rule("exclude_modules", config.exclude_modules)):
        for name in names:
            rule.matches(name)
        if rule.unused():
            raise unmatched_error(rule, type(model).__name__, tensorizable_names(model))


def tensorizable_names(model: nn.Module) -> list[str]:
    """Names of ``model``'s modules that ``tensorize`` swaps when a rule names them (output heads included)."""
    scan, no_rule = _ModelScan.of(model), Rule("exclude_modules", None)
    names: list[str] = []
    inside: list[str] = []  # a tensorized or convertible module's children are not candidates of their own
    for name, module in model.named_modules():
        if not name or any(name.startswith(prefix) for prefix in inside):
            continue
        converter = None if isinstance(module, TensorizedModule) else converter_for(module)
        if isinstance(module, TensorizedModule) or converter is not None:
            inside.append(name + ".")
        if converter is not None and _skip_reason(name, module, converter, scan, True, no_rule, include_heads=True) is None:
            names.append(name)
    return names


def planned_sizes(model: nn.Module, config: TensorizeConfig) -> tuple[list[str], int, int]:
    """The layers ``tensorize(model, config)`` would swap, their dense parameters and their tensorized ones; nothing is
    swapped and no random number is drawn."""
    swaps, _ = _dry_run(model, config)
    return [r.name for _, _, r in swaps], sum(r.dense_parameters for _, _, r in swaps), sum(r.tt_parameters for _, _, r in swaps)


def skipped_layers(model: nn.Module, config: TensorizeConfig) -> list[tuple[str, str]]:
    """The layers ``tensorize(model, config)`` would leave dense, each with why; nothing is swapped and no random number
    is drawn."""
    return _dry_run(model, config)[1].skipped


def _dry_run(model: nn.Module, config: TensorizeConfig) -> tuple[list[tuple[nn.Module, TensorizedModule, SwapRecord]], TensorizeReport]:
    """``tensorize``'s decisions without the swaps. The layers it builds to decide draw their initial cores: the random
    streams are put back, so planning (a budget's start caps, the report) leaves a seeded run's initialisation as it was."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        report = TensorizeReport(model_parameters_before=0)
        swaps = _plan(model, config, _ModelScan.of(model), Rule("target_modules", config.target_modules),
                      Rule("exclude_modules", config.exclude_modules), report)
    return swaps, report


def to_dense(model: nn.Module) -> list[str]:
    """Replace every tensorized layer of ``model`` by the equivalent dense module, in place; returns their names.

    Each becomes the type it was made from (``TTLinear`` → ``nn.Linear``, ``TTEmbedding`` →
    ``nn.Embedding``, ``TTConv1D`` → Hugging Face ``Conv1D``, ...); each swap is logged.
    """
    names_of = _ModelScan.of(model).names_of
    converted: list[str] = []
    for name, module in list(model.named_modules()):
        if any(name.startswith(done + ".") for done in converted):
            continue  # already exported with its parent collection
        if isinstance(module, TensorizedModule):
            dense = module.to_dense_module()
            dense.train(module.training)
            _replace_everywhere(model, names_of[id(module)], dense)
            converted.append(name)
            log.info("to_dense: %s %s -> %s", name, type(module).__name__, type(dense).__name__)
    return converted


# ---------------------------------------------------------------------- deciding
@dataclass
class _ModelScan:
    """What deciding about one module needs to know about the whole model."""

    names_of: dict[int, list[str]]  # every name under which a module is reachable
    tied: dict[int, list[str]]  # weight id -> names of the modules holding it
    heads: dict[str, str]  # output heads -> why they are taken for one
    attention: list[str]  # name prefixes of attention blocks

    @classmethod
    def of(cls, model: nn.Module) -> _ModelScan:
        names_of: dict[int, list[str]] = {}
        for name, module in model.named_modules(remove_duplicate=False):
            names_of.setdefault(id(module), []).append(name)
        tied: dict[int, list[str]] = {}
        for name, module in model.named_modules():
            weight = None if isinstance(module, TensorizedModule) else getattr(module, "weight", None)
            if isinstance(weight, nn.Parameter):
                tied.setdefault(id(weight), []).append(name)
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        return cls(names_of, tied, output_heads(model, linears), attention_blocks(model))

    def in_attention(self, name: str) -> bool:
        """Whether ``name`` is an attention module or one of its projections."""
        return any(name == block or name.startswith(block + ".") for block in self.attention)

    def head_reason(self, name: str) -> str | None:
        """Why ``name`` is taken for an output head, or None."""
        return self.heads.get(name)


def _plan(
    model: nn.Module, config: TensorizeConfig, scan: _ModelScan, targets: Rule, excludes: Rule, report: TensorizeReport
) -> list[tuple[nn.Module, TensorizedModule, SwapRecord]]:
    """Decide module by module; skipped ones go to ``report``; returns the swaps to make."""
    swaps = []
    inside: list[str] = []  # a tensorized or converted module's children are its own business
    for name, module in model.named_modules():
        if not name or any(name.startswith(prefix) for prefix in inside):
            continue
        if isinstance(module, TensorizedModule):
            inside.append(name + ".")
            if not targets.given or targets.matches(name):
                report.already_tensorized.append(name)
            continue
        converter = converter_for(module)
        if converter is None:
            unhandled = _large_weight(module)
            if unhandled is not None and (not targets.given or targets.matches(name)):
                report.skipped.append((name, no_converter_reason(module, unhandled)))
            continue
        if targets.given and not targets.matches(name):
            continue
        inside.append(name + ".")  # decided here, with its children (an EmbeddingBagCollection's tables)
        reason = _skip_reason(name, module, converter, scan, targets.given, excludes, config.include_heads)
        if reason is None and not targets.given:
            reason = _default_exclusion(name, module, config, scan)
        if reason is None:
            built = build_layer(name, module, converter, config, scan.head_reason(name) is not None and widens(module))
            if built.compression_ratio() >= config.min_compression:
                swaps.append((module, built, SwapRecord.of(name, module, built)))
                continue
            reason = f"too small to gain ({built.compression_ratio():.2f}x < min_compression={config.min_compression})"
        report.skipped.append((name, reason))
    return swaps


def _default_exclusion(name: str, module: nn.Module, config: TensorizeConfig, scan: _ModelScan) -> str | None:
    """Why a module the default rules would take stays dense (attention, embedding tables), or None."""
    if not config.include_attention and scan.in_attention(name):
        return "attention projection: dense unless include_attention=True (or named in target_modules)"
    if not config.include_embeddings and isinstance(module, nn.Embedding):
        return "embedding table: dense because include_embeddings=False (or name it in target_modules)"
    return None


def _large_weight(module: nn.Module) -> str | None:
    """``"AxB"`` when ``module`` itself holds a weight matrix big enough to be worth tensorizing, else None."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, nn.Parameter) and weight.dim() >= 2 and weight.numel() >= LARGE_WEIGHT:
        return "x".join(map(str, weight.shape))
    return None


def _skip_reason(name: str, module: nn.Module, converter: Converter, scan: _ModelScan, explicit: bool, excludes: Rule,
                 include_heads: bool) -> str | None:
    if excludes.matches(name):
        return "excluded by exclude_modules"
    weight = getattr(module, "weight", None)
    if weight is not None and len(scan.tied.get(id(weight), [])) > 1:  # before the head rule: an LM head is often tied
        others = [n for n in scan.tied[id(weight)] if n != name]
        return f"weight is tied to {others}: both stay dense (tensorizing one side would untie them)"
    head = None if explicit or (include_heads and widens(module)) else scan.head_reason(name)
    if head is not None:
        why = "fewer outputs than inputs: a classifier stays dense" if include_heads else "include_heads=False"
        return f"output head ({head}; {why}); name it in target_modules to tensorize it"
    if weight is None and not any(p.requires_grad for p in module.parameters()):
        return "frozen (no parameter requires grad)"
    if weight is not None and not weight.requires_grad:
        return "frozen (weight.requires_grad is False)"
    return converter.unsupported(module)


def _replace_everywhere(model: nn.Module, names: list[str], new: nn.Module) -> None:
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)


def _count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

