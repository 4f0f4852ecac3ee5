"""BudgetConfig: the one home of the size budget and the stages' knobs (as ``TensorizeConfig`` is for layers).

``ComeraCallback(budget=BudgetConfig(...))`` and the CLI's ``comera.budget`` section use it; the callback's
direct arguments of the same names (``early_epochs``, ``target_ratio``, ...) override its fields.

The size asked for, one of (docs/METHOD.md §2.3):

* ``compression``: the tensorized layers end this many times smaller than the dense layers they replaced
  (the default: 4);
* ``parameters``: the whole model ends with this many parameters;
* ``target_ratio``: the tensorized layers end at this fraction of their size at the stage switch.

Asking for none of them asks for ``DEFAULT_COMPRESSION``; asking for two is an error.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from comera_lightning._checks import check_count, check_number
from comera_lightning.optim.gates import DEFAULT_GATE_LR
from torch import nn

from comera_lightning.rank import CompressionStats
from comera_lightning.tensorize import planned_sizes
from comera_lightning.tensorize.config import TensorizeConfig

__all__ = ["BUDGET_CUTS", "BUDGET_LATE_OBJECTIVES", "DEFAULT_COMPRESSION", "BUDGET_PRUNES", "BUDGET_SHRINK_SHARE", "START_FACTOR",
           "TRAINED_EARLY_SHARE", "TRAINED_LATE_SHARE", "TRAINED_START_COMPRESSION", "BudgetConfig"]

#: The size asked when none is: the tensorized layers 4x smaller than dense (they start at 2x: START_FACTOR).
DEFAULT_COMPRESSION = 4.0
#: Prunes of a budget's late stage when its interval is not given: the size falls in that many steps, over the first
#: ``BUDGET_SHRINK_SHARE`` of the late stage; the rest of it trains at the size reached (AdaLoRA's final phase).
BUDGET_PRUNES = 10
BUDGET_SHRINK_SHARE = 0.5
#: A model tensorized from its trained weights (``TensorizeConfig(init="svd")``) with no stage length given: the
#: early stage is this share of the run, the late stage (the cuts, over its first half) the next ``TRAINED_LATE_SHARE``;
#: the rest trains at the size reached (docs/COMPRESS.md: on a trained Llama 4x smaller, 3.446 against 3.531 with
#: 5 % + 20 % and 4.398 with the from-scratch schedule, two thirds early).
TRAINED_EARLY_SHARE = 0.1
TRAINED_LATE_SHARE = 0.4
#: With a budget in compression or parameters, the tensorized layers start this many times larger than asked
#: (AdaLoRA starts at 1.5x its final budget): the late stage has that much to give up where it hurts least.
START_FACTOR = 2.0
#: From trained weights (``init="svd"``) the start may be as large as the dense layers it replaces (1x, not
#: ``min_compression``): the cuts then begin from a model that has lost little (a trained Llama 2x smaller: 3.225
#: against 3.244 from a start capped at 1.5x; docs/COMPRESS.md). At 4x it also lets a kind of layer start less than
#: min_compression smaller where its cap used to be lowered (GPT-2's token table at 1.4x); the old rule was 0.3 % better
#: on average over nine trained runs at 4x, within the seeds' spread (docs/CHANGELOG.md, 2026-11-30).
TRAINED_START_COMPRESSION = 1.0
#: An adaptive start at which some kind of layer would not gain ``min_compression`` (and stay dense) lowers that
#: kind's rank cap by this factor, at most ``START_TRIES`` times.
START_BACKOFF = 0.9
START_TRIES = 20
#: A start this far below the size asked is warned about (the caps reach no higher: the run cannot end at the size asked).
START_SHORTFALL = 0.1

#: ``budget``: ranks shrink to the size asked on a schedule, least important first, while quality holds;
#: ``guarded``: the size term of the loss shrinks them while quality holds (no size is promised);
#: ``paper``: the paper's trade-off of loss against size (docs/METHOD.md §2).
BUDGET_LATE_OBJECTIVES = ("budget", "guarded", "paper")
BUDGET_CUTS = ("gates", "svd")
#: Options of which one is set at most: a later value of one replaces the others (``BudgetConfig.replace``).
_ONE_OF = ({"compression", "parameters", "target_ratio"}, {"early_epochs", "early_steps"}, {"late_epochs", "late_steps"},
           {"prune_every_n_epochs", "prune_every_n_steps"})


@dataclass(frozen=True)
class BudgetConfig:
    """How small the tensorized layers end, when they shrink, and what they may not lose.

    Args:
        compression: the tensorized layers end this many times smaller than dense; None (and neither of the two below):
            ``DEFAULT_COMPRESSION``, 4.
        parameters: the whole model ends with this many parameters (instead of ``compression``).
        target_ratio: the tensorized layers end at this fraction of their size at the switch (instead of ``compression``).
        early_epochs: epochs of the early stage; None (and no early_steps): two thirds of the Trainer's max_epochs
            (or of its max_steps).
        early_steps: optimizer steps of the early stage, instead of early_epochs.
        late_epochs: epochs of the late stage, then the task loss alone; None (and no late_steps): until training ends.
        late_steps: optimizer steps of the late stage, instead of late_epochs.
        prune_every_n_epochs: prune interval of the late stage in epochs; None (and no prune_every_n_steps): every epoch.
        prune_every_n_steps: prune interval of the late stage in optimizer steps, instead of epochs.
        adapt: with compression or parameters, start at twice the size asked and let training decide which ranks go;
            False: start at the size asked (uniform rank caps) and keep it (fixed ranks: cheaper, nothing adapts).
        late_objective: "budget": at each prune the ranks shrink toward the size asked (cubically, reaching it at
            the last prune), the least important rank indices first, while the loss holds; "guarded": the size term
            shrinks them while the loss holds; "paper": the paper's trade-off of loss against size.
        cut: how the budget cuts a bond: "gates": its least important gates' indices; "svd": a linear layer's bond is
            first re-expressed in its SVD basis and loses its weakest directions (token tables and vocabulary heads keep
            the gates' choice); measured: up to 1.7 % lower loss at 4x, 1 % higher at 16x on GPT-2
            (docs/TUNING_FRONTIER.md, "The cut").
        loss_tolerance: how much worse than its best since the switch (a fraction) the loss may get before shrinking pauses.
        allow_rank0: a layer may lose every rank (it then outputs its bias only); False keeps each bond's last rank.
        rank_weight: γ, the weight of the size surrogate R in the early stage's objective L + γR.
        gate_lr: learning rate of the gates' own Adam (no weight decay).
        loss_target: a fixed L₀ for the late stage; None: the value of loss_target_metric at the switch.
        loss_target_metric: the logged metric taken for L₀ ("train": the last early epoch's mean training loss);
            None: val/loss or alike, else "train".
        loss_weight: ρ_L, the task loss's own weight in the paper's late-stage objective.
        size_weight: ρ_R, the size surrogate's own weight in the paper's late-stage objective.
        size_surrogate: R: "mean" (mean of the gates) or "size" (each gate weighted by the core parameters it controls).
    """

    compression: Union[float, None] = None
    parameters: Union[int, None] = None
    target_ratio: Union[float, None] = None
    early_epochs: Union[int, None] = None
    early_steps: Union[int, None] = None
    late_epochs: Union[int, None] = None
    late_steps: Union[int, None] = None
    prune_every_n_epochs: Union[int, None] = None
    prune_every_n_steps: Union[int, None] = None
    adapt: bool = True
    late_objective: Literal["budget", "guarded", "paper"] = "budget"
    cut: Literal["gates", "svd"] = "gates"
    loss_tolerance: float = 0.02
    allow_rank0: bool = False
    rank_weight: float = 0.0
    gate_lr: float = DEFAULT_GATE_LR
    loss_target: Union[float, None] = None
    loss_target_metric: Union[str, None] = None
    loss_weight: float = 0.1
    size_weight: float = 0.01
    size_surrogate: Literal["mean", "size"] = "mean"

    def __post_init__(self) -> None:
        asked = [name for name in ("compression", "parameters", "target_ratio") if getattr(self, name) is not None]
        if len(asked) > 1:
            raise ValueError(f"BudgetConfig asks for {' and '.join(f'{n}={getattr(self, n)}' for n in asked)}: ask for one "
                             "size (compression, parameters or target_ratio), or none for the default compression.")
        if self.compression is not None:
            check_number("compression", self.compression, 1.0, low_open=True)
        check_count("parameters", self.parameters)
        if self.target_ratio is not None:
            check_number("target_ratio", self.target_ratio, 0.0, 1.0, low_open=True)
        if self.late_objective not in BUDGET_LATE_OBJECTIVES:
            raise ValueError(f"late_objective={self.late_objective!r} is unknown; choose one of {BUDGET_LATE_OBJECTIVES}.")
        if self.cut not in BUDGET_CUTS:
            raise ValueError(f"cut={self.cut!r} is unknown; choose one of {BUDGET_CUTS}.")
        for name in ("allow_rank0", "adapt"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}.")

    def replace(self, **changes: Any) -> BudgetConfig:
        """A copy with ``changes`` applied (validated); unknown option names are refused. A size asked in ``changes``
        (compression, parameters or target_ratio) replaces the one asked before; a stage length or prune interval
        given in steps replaces the one given in epochs, and the other way round."""
        unknown = set(changes) - set(self.option_names())
        if unknown:
            raise TypeError(f"unknown budget option(s) {sorted(unknown)}; valid: {self.option_names()}.")
        given = {k for k, v in changes.items() if v is not None}
        for group in _ONE_OF:  # a size or a stage length given in changes replaces the one given before, in any unit
            if group & given:
                changes = {**{name: None for name in group}, **changes}
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what a checkpoint records)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BudgetConfig:
        """Rebuild from ``to_dict()`` output or a user's mapping; options not given take today's defaults."""
        return cls().replace(**dict(values))

    @classmethod
    def option_names(cls) -> list[str]:
        """The option names, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @property
    def asked_compression(self) -> float | None:
        """The compression asked: ``compression``, or the default one when no size is asked at all."""
        if self.compression is None and self.parameters is None and self.target_ratio is None:
            return DEFAULT_COMPRESSION
        return self.compression

    def end_size(self, size_at_switch: float, stats: CompressionStats, overhead: float = 0.0) -> float:
        """The size asked at the end for the tensorized layers' cores, given their size at the switch, the model's counts
        now and ``overhead`` (what the tensorized layers hold besides cores: gates, biases); with ``adapt=False`` the
        caps were set at the size asked: the size at the switch."""
        if self.asked_compression is not None:
            asked = stats.dense_tt_parameters / self.asked_compression - overhead
        elif self.parameters is not None:
            rest = stats.model_parameters - stats.tt_parameters
            self._check_parameters(rest + overhead)
            asked = float(self.parameters - rest - overhead)
        else:
            return self.target_ratio * size_at_switch
        return max(1.0, asked) if self.adapt else size_at_switch

    def start_caps(self, model: nn.Module, config: TensorizeConfig) -> TensorizeConfig:
        """``config`` with its rank fractions scaled so the tensorized layers start at ``START_FACTOR`` times the size
        asked (full rank at most, and low enough that every layer still gains ``min_compression``; from trained
        weights, ``init="svd"``, no larger than the dense layers): room for training to decide where the ranks go.
        Unchanged when the size is asked as ``target_ratio`` or ``config``
        fixes ``max_rank`` (the user chose the caps)."""
        if (self.asked_compression is None and self.parameters is None) or config.max_rank is not None:
            return config
        names, dense, planned = planned_sizes(model, config)
        if not planned:
            return config
        rest = sum(p.numel() for p in model.parameters()) - dense
        if self.parameters is not None:
            self._check_parameters(rest)
        asked = dense / self.asked_compression if self.asked_compression is not None else self.parameters - rest
        # the layers are chosen at the user's min_compression (names); from trained weights they may start above it
        floor = min(config.min_compression, TRAINED_START_COMPRESSION) if config.init == "svd" else config.min_compression
        start = min(START_FACTOR * asked, dense / floor) if self.adapt else asked
        scale = start / planned
        fractions = ("rank_fraction", "embedding_rank_fraction", "head_rank_fraction")
        caps = config.replace(target_modules=names, min_compression=floor,
                              **{name: min(1.0, getattr(config, name) * scale) for name in fractions})
        plan = planned_sizes(model, caps)
        # a kind with no layer (a model without a vocabulary head) must not be "lowered": that changes nothing, which
        # the order below would prefer forever; a kind the model has changes the plan when its cap is cut 1000-fold
        kinds = [name for name in fractions
                 if planned_sizes(model, caps.replace(**{name: getattr(caps, name) * 1e-3})) != plan]
        for _ in range(START_TRIES):  # the same layers at any caps: where a kind of layer would not gain
            # min_compression at its start (a small head at a large rank), that kind's cap alone is lowered
            if len(plan[0]) == len(names) or not kinds:
                break
            lowered = [caps.replace(**{name: getattr(caps, name) * START_BACKOFF}) for name in kinds]
            plan, caps = min(((planned_sizes(model, c), c) for c in lowered), key=lambda pc: _fewest_lost_then_largest(pc[0]))
        reached = plan[2]
        if reached < (1 - START_SHORTFALL) * asked:
            what = f"compression={self.asked_compression:g}" if self.asked_compression else f"parameters={self.parameters:,}"
            warnings.warn(f"BudgetConfig({what}): the tensorized layers start at {reached:,} parameters ({dense / reached:.1f}x "
                          f"smaller than dense), already below the {asked:,.0f} asked ({dense / asked:.1f}x): their rank caps "
                          "reach no higher while every layer keeps gaining min_compression (a token table's rank is capped at "
                          "its width), and the run ends no larger than it starts. Ask for more compression, or raise "
                          "TensorizeConfig's rank fractions.", UserWarning, stacklevel=2)
        return caps

    def _check_parameters(self, fixed: int) -> None:
        """A parameter budget no larger than what the ranks cannot cut is refused, naming both."""
        if self.parameters <= fixed:
            raise ValueError(f"BudgetConfig(parameters={self.parameters:,}) is no more than the model's {fixed:,} parameters "
                             "outside its tensorized layers' cores: ask for more, or tensorize more layers (TensorizeConfig).")

    @classmethod
    def argument_docs(cls, names: list[str]) -> str:
        """The ``Args:`` entries of ``names`` in this docstring, each saying it overrides the budget config's: what a class
        taking them as shortcuts appends to its own docstring (the CLI's --help reads descriptions from docstrings)."""
        entries: dict[str, str] = {}
        for line in cls.__doc__.split("Args:", 1)[1].splitlines():
            if (match := re.match(r" {8}(\w+): (.*)", line)):
                name, text = match.groups()
                entries[name] = text
            elif line.startswith(" " * 12) and entries:
                entries[name] += " " + line.strip()
        return "".join(f"        {name}: {entries[name]} Given, it overrides the budget config's.\n" for name in names)

    def asked(self) -> str:
        """The size asked for, in words."""
        if self.asked_compression is not None:
            return f"compression={self.asked_compression:g}x of the tensorized layers"
        if self.parameters is not None:
            return f"parameters={self.parameters:,} in the whole model"
        return f"target_ratio={self.target_ratio:g} of the tensorized layers' size at the switch"


def _fewest_lost_then_largest(plan: tuple[list[str], int, int]) -> tuple[int, int]:
    """Order ``planned_sizes`` results: the most layers kept first, then the largest start."""
    names, _, planned = plan
    return -len(names), -planned
