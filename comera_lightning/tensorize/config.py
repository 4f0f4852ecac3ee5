"""TensorizeConfig: the one home of ``tensorize``'s options, their defaults and their validation.

``tensorize(model, config)``, ``ComeraCallback(tensorize=config)`` (the CLI's ``comera.tensorize``
section) and the checkpoint (``checkpoint["comera"]["tensorize"]``) all use it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from comera_lightning._checks import check_number
from comera_lightning.tensorize.registry import known_options

__all__ = ["DEFAULT_EMBEDDING_RANK", "INIT_CHOICES", "RECORDS_BEFORE", "TRAINED_TABLE_CORES", "ModuleRules", "TensorizeConfig"]

ModuleRules = Union[str, list[str], None]
INIT_CHOICES = ("random", "paper", "svd")
#: An embedding's largest rank when neither ``embedding_max_rank`` nor ``max_rank`` is set.
DEFAULT_EMBEDDING_RANK = 30
#: Cores of a TorchRec table tensorized from its trained weights (``init="svd"``) when ``embedding_num_cores`` is None:
#: two factors (``TTEmbedding(num_cores=1)``).
TRAINED_TABLE_CORES = 1


#: Options added after checkpoints were written, with the value that reproduces what older code did.
RECORDS_BEFORE: dict[str, Any] = {"include_heads": False}


@dataclass(frozen=True)
class TensorizeConfig:
    """Which layers become tensor trains, and how.

    Args:
        target_modules: module names to tensorize (a list: a name or a dotted suffix of one, e.g.
            ``"query"``) or a regular expression matching whole names; ``None``: every supported
            layer except classifier heads, attention projections, tied, frozen and too-small ones.
        exclude_modules: the same kind of rule, for modules to leave dense.
        max_rank: the largest bond rank of linear layers (an int, or one per bond); None: ``rank_fraction``
            of each layer's smaller side.
        rank_fraction: a linear layer's largest rank as a fraction of its smaller side, when ``max_rank`` is None.
        embedding_max_rank: the largest bond rank of embeddings (default: ``max_rank``; else ``embedding_rank_fraction``
            of an ``nn.Embedding``'s dim, and 30 for TorchRec tables).
        embedding_rank_fraction: an ``nn.Embedding``'s largest rank as a fraction of its embedding dim, when neither
            ``embedding_max_rank`` nor ``max_rank`` is set.
        head_rank_fraction: a vocabulary head's (``include_heads``) largest rank as a fraction of its width, when
            ``max_rank`` is not set (3/8: chosen on the quality race, docs/TUNING_QUALITY_RACE.md "Output heads").
        num_cores: cores per side of a linear layer (or ``[input cores, output cores]``); 1: a gated
            low-rank product, 3: the paper's six-core trains (docs/METHOD.md §1.1).
        embedding_num_cores: cores of an embedding table; 1: two factors (rows × rank, rank × dim), as ``num_cores=1``
            is for linears; None: 2 for an ``nn.Embedding`` (a two-core TT-matrix), 4 for TorchRec tables, or 1 with
            ``init="svd"`` for TorchRec tables and for the ``nn.Embedding`` tables whose truncated SVD keeps clearly
            more of them than the TT-matrix (``tensorize/table_form.py``).
        init: ``"random"`` (variance of the layer replaced), ``"paper"`` (docs/METHOD.md §1.1) or
            ``"svd"`` (TT-SVD of the current weights, for pretrained models).
        layer_config: per-layer overrides, ``{rule: {option: value}}``; a rule is a name, a dotted
            suffix, or ``"re:<regex>"``.
        include_embeddings: with ``target_modules`` None, tensorize ``nn.Embedding`` tables too (the default:
            on docs/TUNING_QUALITY_RACE.md's race a two-core TT token table at half the dim lowered a Llama's loss while
            removing most of its parameters; TorchRec collections are tensorized either way).
        include_attention: with ``target_modules`` None, tensorize attention projections too (they stay
            dense by default: compressing them costs language models the most quality, docs/TUNING.md).
        include_heads: with ``target_modules`` None, tensorize output heads to a vocabulary (more outputs than
            inputs, e.g. a language model's untied ``lm_head``) too, at ``head_rank_fraction`` (the default: such a
            head is most of a small model's step; docs/TUNING_QUALITY_RACE.md "Output heads"). Classification heads (fewer outputs
            than inputs) and tied heads stay dense either way.
        min_compression: layers that would compress less than this stay dense.
        gate_threshold: a rank gate at or below this is dead and pruned, in ``[0, 1)``.
    """

    target_modules: ModuleRules = None
    exclude_modules: ModuleRules = None
    max_rank: Union[int, list[int], None] = None
    rank_fraction: float = 0.25
    embedding_max_rank: Union[int, list[int], None] = None
    embedding_rank_fraction: float = 0.5
    head_rank_fraction: float = 0.375
    num_cores: Union[int, list[int]] = 1
    embedding_num_cores: Union[int, None] = None
    init: str = "random"
    layer_config: Union[dict[str, dict[str, Any]], None] = None
    include_embeddings: bool = True
    include_attention: bool = False
    include_heads: bool = True
    min_compression: float = 1.5
    gate_threshold: float = 1e-2

    def __post_init__(self) -> None:
        for name in ("target_modules", "exclude_modules"):
            _check_rules(name, getattr(self, name))
        if self.max_rank is not None:
            _check_ranks("max_rank", self.max_rank)
        check_number("rank_fraction", self.rank_fraction, 0.0, 1.0, low_open=True)
        if self.embedding_max_rank is not None:
            _check_ranks("embedding_max_rank", self.embedding_max_rank)
        _check_ranks("num_cores", self.num_cores)
        check_number("embedding_rank_fraction", self.embedding_rank_fraction, 0.0, 1.0, low_open=True)
        check_number("head_rank_fraction", self.head_rank_fraction, 0.0, 1.0, low_open=True)
        if self.embedding_num_cores is not None:
            _check_ranks("embedding_num_cores", self.embedding_num_cores)
        if self.init not in INIT_CHOICES:
            raise ValueError(f"init={self.init!r} is not supported; choose one of {INIT_CHOICES}.")
        for name in ("include_embeddings", "include_attention", "include_heads"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}.")
        check_number("min_compression", self.min_compression, 0.0)
        check_number("gate_threshold", self.gate_threshold, 0.0, 1.0, high_open=True)
        _check_layer_config(self.layer_config or {})

    def replace(self, **changes: Any) -> TensorizeConfig:
        """A copy with ``changes`` applied (validated); unknown option names are refused."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown tensorize option(s) {sorted(unknown)}; valid: {self.option_names()}.")
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what a checkpoint records)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TensorizeConfig:
        """Rebuild from ``to_dict()`` output or a user's mapping; options not given take today's defaults."""
        return cls().replace(**dict(values))

    @classmethod
    def from_record(cls, values: Mapping[str, Any]) -> TensorizeConfig:
        """Rebuild a checkpoint's record: an option the record predates takes the value that gave the behaviour
        of its time (``RECORDS_BEFORE``), so an older checkpoint loads as it was written."""
        return cls.from_dict({**RECORDS_BEFORE, **dict(values)})

    @classmethod
    def option_names(cls) -> list[str]:
        """The option names, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]


def _check_ranks(name: str, value: Any) -> None:
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise ValueError(f"{name} must be an integer >= 1 (or a list of them), got {value!r}.")


def _check_rules(name: str, rules: Any) -> None:
    if rules is None:
        return
    if isinstance(rules, str):
        try:
            re.compile(rules)
        except re.error as err:
            raise ValueError(f"{name}={rules!r} is not a valid regular expression: {err}.") from err
        return
    if not isinstance(rules, Iterable) or not all(isinstance(e, str) and e for e in rules):
        raise TypeError(f"{name} must be a regex string or a list of module names, got {rules!r}.")


def _check_layer_config(layer_config: Mapping[str, Any]) -> None:
    if not isinstance(layer_config, Mapping):
        raise TypeError(f"layer_config must map a module rule to overrides, got {layer_config!r}.")
    allowed = known_options()
    for key, overrides in layer_config.items():
        if not isinstance(overrides, Mapping):
            raise TypeError(f"layer_config[{key!r}] must be a mapping of overrides, got {overrides!r}.")
        unknown = set(overrides) - allowed
        if unknown:
            raise ValueError(f"layer_config[{key!r}] has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}.")
        if "init" in overrides and overrides["init"] not in INIT_CHOICES:
            raise ValueError(f"layer_config[{key!r}]['init']={overrides['init']!r}; choose one of {INIT_CHOICES}.")
