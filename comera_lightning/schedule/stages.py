"""StageSchedule: when CoMERA switches stages and prunes ranks, by epochs or by steps (docs/METHOD.md §2).

Stages: ``early`` (task loss plus the size surrogate), ``late`` (achievement scalarisation,
pruned at the switch and every N epochs/steps), and ``final`` (task loss only, reached when
the late stage has a length). The schedule only decides; whoever drives it (the callback)
carries out the returned events ``"switch"``, ``"prune"``, ``"finish"`` and ``"end"`` (training
ends in the early stage: the ranks that died are pruned once, no late stage) and reports back with
``enter_late``, ``enter_final`` and ``record_prune``.
"""

from __future__ import annotations

import warnings
from typing import Any

from comera_lightning._checks import check_count, check_exclusive

__all__ = ["STAGES", "StageSchedule"]

STAGES = ("early", "late", "final")
_PROGRESS = ("stage", "early_epochs_resolved", "early_steps_resolved", "late_start_epoch", "late_start_step",
             "last_late_prune_step", "planned_prune_steps", "last_prune_step", "prune_events", "epochs_ended")


class StageSchedule:
    """Early → late → final, epoch- or step-based, with the late stage's prune points.

    ``early_epochs``/``early_steps``: length of the early stage (neither: two thirds of the
    Trainer's ``max_epochs``, fixed by ``resolve``). ``late_epochs``/``late_steps``: length of
    the late stage (neither: until training ends). ``prune_every_n_epochs``/``_steps``: prune
    interval in the late stage (neither: every epoch).
    """

    def __init__(
        self,
        early_epochs: int | None = None,
        early_steps: int | None = None,
        late_epochs: int | None = None,
        late_steps: int | None = None,
        prune_every_n_epochs: int | None = None,
        prune_every_n_steps: int | None = None,
    ) -> None:
        check_count("early_epochs", early_epochs, 0)
        check_count("early_steps", early_steps, 0)
        for name, value in (("late_epochs", late_epochs), ("late_steps", late_steps),
                            ("prune_every_n_epochs", prune_every_n_epochs), ("prune_every_n_steps", prune_every_n_steps)):
            check_count(name, value)
        check_exclusive(**{
            "early_epochs|early_steps": (early_epochs, early_steps),
            "late_epochs|late_steps": (late_epochs, late_steps),
            "prune_every_n_epochs|prune_every_n_steps": (prune_every_n_epochs, prune_every_n_steps),
        })
        self.early_epochs, self.early_steps = early_epochs, early_steps
        self.late_epochs, self.late_steps = late_epochs, late_steps
        self.prune_every_n_steps = prune_every_n_steps
        self.prune_every_n_epochs = prune_every_n_epochs if prune_every_n_steps is not None else (prune_every_n_epochs or 1)
        self.interval_given = prune_every_n_steps is not None or prune_every_n_epochs is not None
        self._lengths_given = any(v is not None for v in (early_epochs, early_steps, late_epochs, late_steps))
        self.stage = "early"
        self.early_epochs_resolved = early_epochs
        self.early_steps_resolved = early_steps
        self.late_start_epoch: int | None = None
        self.last_late_prune_step: int | None = None  # where the late stage's prunes end (plan_late)
        self.planned_prune_steps: int | None = None  # the late stage's prune interval plan_late chose
        self.late_start_step: int | None = None
        self.last_prune_step = -1
        self.prune_events = 0
        self.epochs_ended = 0  # epoch ends handled (a resume checks that none was skipped)
        self.max_epochs: int | None = None  # the Trainer's, fixed by resolve (not progress: a resume may change it)

    def resolve(self, max_epochs: int | None, max_steps: int | None = None) -> tuple[list[str], list[str]]:
        """Fix the default early stage from the Trainer's ``max_epochs`` (else ``max_steps``); returns (information,
        warnings) for the user."""
        infos, warnings_ = [], []
        self.max_epochs = max_epochs if max_epochs is not None and max_epochs > 0 else None
        if self.early_epochs_resolved is None and self.early_steps_resolved is None:
            if self.max_epochs is None and (max_steps is None or max_steps < 1):
                raise ValueError("ComeraCallback needs early_epochs or early_steps when the Trainer has neither max_epochs "
                                 "nor max_steps.")
            if self.max_epochs is None:
                self.early_steps_resolved = max(1, round(2 * max_steps / 3))
                infos.append(f"early stage = {self.early_steps_resolved} of {max_steps} steps (2/3, the paper's 20 of 30 epochs).")
            else:
                self.early_epochs_resolved = max(1, round(2 * max_epochs / 3))
                infos.append(f"early stage = {self.early_epochs_resolved} of {max_epochs} epochs (2/3, the paper's 20 of 30).")
        early = self.early_epochs_resolved
        if early is not None and max_epochs is not None and 0 < max_epochs <= early:
            warnings_.append(
                f"early_epochs={early} >= max_epochs={max_epochs}: no late (compression) stage; the ranks that died in the "
                "early stage are pruned once, when training ends. Raise max_epochs or lower early_epochs to compress further."
            )
        return infos, warnings_

    @property
    def lengths_given(self) -> bool:
        """Whether the user fixed a stage's length (then no default length applies; ``resolve_trained`` does not count)."""
        return self._lengths_given

    def resolve_trained(self, total_steps: float, early_share: float, late_share: float, max_epochs: int | None = None) -> str:
        """A model compressed from trained weights: the early stage the first ``early_share`` of the run's
        ``total_steps`` (the gates learn what matters), the late stage the next ``late_share`` (the cuts); then the
        rest of the run trains at the size reached. Returns what was fixed, in words."""
        self.early_steps_resolved = max(1, round(early_share * total_steps))
        self.late_steps = max(2, round(late_share * total_steps))
        self.early_epochs_resolved = None
        self.max_epochs = max_epochs if max_epochs is not None and max_epochs > 0 else None
        rest = max(0, round(total_steps) - self.early_steps_resolved - self.late_steps)
        return (f"from trained weights (init='svd'): early stage = {self.early_steps_resolved} of {round(total_steps)} steps, "
                f"then a late stage of {self.late_steps} (the cuts in its first half), then {rest} steps at the size reached.")

    def after_batch(self, step: int) -> str | None:
        """The step-based event due after global step ``step``, if any."""
        if step == self.last_prune_step:
            return None
        if self.stage == "early":
            return "switch" if self.early_steps_resolved is not None and step >= self.early_steps_resolved else None
        if self.stage != "late":
            return None
        since = step - self.late_start_step
        if self.late_steps is not None and since >= self.late_steps:
            return "finish"
        every = self.planned_prune_steps or self.prune_every_n_steps
        return "prune" if every and since % every == 0 else None

    def after_epoch(self, epochs_done: int) -> str | None:
        """The epoch-based event due once ``epochs_done`` epochs have finished, if any."""
        self.epochs_ended = epochs_done
        if self.stage == "early":
            early = self.early_epochs_resolved
            if self.max_epochs is not None and epochs_done >= self.max_epochs and (early is None or early >= self.max_epochs):
                return "end"
            return "switch" if early is not None and epochs_done >= early else None
        if self.stage != "late":
            return None
        since = epochs_done - self.late_start_epoch
        if self.late_epochs is not None and since >= self.late_epochs:
            return "finish"
        if self.planned_prune_steps:
            return None  # the late stage prunes by steps (plan_late)
        return "prune" if self.prune_every_n_epochs and since % self.prune_every_n_epochs == 0 else None

    def enter_late(self, epochs_done: int, step: int) -> None:
        """The late stage starts now."""
        self.stage, self.late_start_epoch, self.late_start_step = "late", epochs_done, step

    def plan_late(self, total_steps: float | None, steps_per_epoch: float | None, prunes: int | None = None,
                  shrink_share: float = 1.0) -> None:
        """At the switch: when the late stage's shrinking ends, from the run's length (``late_progress``).

        ``prunes`` (a budget's size falls in small steps): unless an interval was given, prune that many times evenly over
        the first ``shrink_share`` of the late stage; the rest of it trains at the size reached. Otherwise the shrinking
        ends one prune before the stage ends, so the last interval trains at the final size.
        """
        start = self.late_start_step
        epochs_to_steps = (lambda n: None if n is None or not steps_per_epoch else n * steps_per_epoch)
        length = self.late_steps or epochs_to_steps(self.late_epochs)
        if length is None and total_steps is not None and total_steps != float("inf"):
            length = total_steps - start
        if not length:
            self.last_late_prune_step = None
            return
        if prunes and not self.interval_given:
            prunes = max(1, min(prunes, int(length * shrink_share)))  # a short late stage: fewer prunes, not a later end
            self.planned_prune_steps = max(1, int(length * shrink_share // prunes))
            self.last_late_prune_step = start + self.planned_prune_steps * prunes
            return
        interval = self.prune_every_n_steps or epochs_to_steps(self.prune_every_n_epochs) or length
        self.last_late_prune_step = start + max(1, int(length // interval) - 1) * int(round(interval))

    def late_progress(self, step: int) -> float:
        """How far through the late stage's prunes ``step`` is: 0 at the switch, 1 at its last prune (and after);
        1 when the run's length is unknown (the budget is then reached at once)."""
        if self.late_start_step is None or not self.last_late_prune_step or self.last_late_prune_step <= self.late_start_step:
            return 1.0
        return min(1.0, (step - self.late_start_step) / (self.last_late_prune_step - self.late_start_step))

    def enter_final(self) -> None:
        """The late stage is over: task loss only from now on."""
        self.stage = "final"

    def record_prune(self, step: int) -> None:
        """A prune happened at ``step``."""
        self.last_prune_step, self.prune_events = step, self.prune_events + 1

    def state_dict(self) -> dict[str, Any]:
        """Progress (the arguments are the constructor's, not saved)."""
        return {key: getattr(self, key) for key in _PROGRESS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; unknown keys are an error."""
        unknown = set(state) - set(_PROGRESS)
        if unknown:
            raise KeyError(f"StageSchedule state has unknown keys {sorted(unknown)}; expected {list(_PROGRESS)}.")
        if state.get("stage", "early") not in STAGES:
            raise ValueError(f"StageSchedule state has stage={state['stage']!r}; expected one of {STAGES}.")
        resolved = state.get("early_epochs_resolved")
        if self.early_epochs is not None and resolved is not None and resolved != self.early_epochs:
            warnings.warn(
                f"early_epochs={self.early_epochs} given now differs from the checkpoint's {resolved}: the argument "
                "given now is used (arguments win over the checkpoint's schedule; its progress is kept).",
                UserWarning,
                stacklevel=2,
            )
            state = {**state, "early_epochs_resolved": self.early_epochs}
        for key, value in state.items():
            setattr(self, key, value)
