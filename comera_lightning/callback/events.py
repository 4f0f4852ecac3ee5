"""What the schedule's decisions do to a run: the stage switch, a prune, a refreshed L₀ (docs/DESIGN_FLOW.md, "where a prune goes").

:class:`~comera_lightning.schedule.StageSchedule` only decides (``"switch"``, ``"prune"``,
``"finish"``); :class:`StageEvents` carries a decision out on the Trainer's module, optimizers and
strategy, and says what happened. ``ComeraCallback`` owns one and calls it from its hooks.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from comera_lightning.callback.metrics import log_rank_table, publish_sizes, write_rank_table
from comera_lightning.callback.trainer import mean_over_ranks, rewrap_ddp
from comera_lightning.optim.gates import GateOptimizer
from comera_lightning.rank import PruneSummary, active_size, latch_dead_gates_, prune_, shrink_to_, state_follower, tt_layers
from comera_lightning.schedule import ComeraObjective, LossTarget, StageSchedule
from comera_lightning.schedule.config import BUDGET_PRUNES, BUDGET_SHRINK_SHARE, TRAINED_EARLY_SHARE, TRAINED_LATE_SHARE
from comera_lightning.schedule.cut_watch import WindowStats
from comera_lightning.strategy.protocol import ResizeListener

__all__ = ["PRUNE_REASONS", "StageEvents", "warn_rank0"]

#: Why each schedule event prunes (the info line says it).
PRUNE_REASONS = {"switch": "stage switch", "prune": "interval", "finish": "end of late stage", "end": "training ends in the early stage"}


class StageEvents:
    """The schedule's events carried out on a run: the switch fixes L₀, S and S₀; every event prunes; the finish ends the late stage."""

    def __init__(self, schedule: StageSchedule, objective: ComeraObjective, loss_target: LossTarget, gates: GateOptimizer,
                 cut: str = "gates", trained: bool = False) -> None:
        self.schedule, self.objective, self.loss_target, self.gates = schedule, objective, loss_target, gates
        self.cut = cut  # BudgetConfig.cut: "svd" re-expresses a linear layer's bond in its SVD basis before cutting it
        self.trained = trained  # the layers start from trained weights: the budget's stages follow resolve_trained
        self.rank0_reported: set[str] = set()  # layers already warned about
        self.held_at: list[int] = []  # steps at which the guard held the budget's shrinking

    def hold_gates(self) -> None:
        """Stop the gates' own steps after a budget's switch: the budget, not the gates' drift, decides what goes.
        (Held from the start on trained weights too, they helped a trained Llama by 0.005-0.015 nats and cost a trained
        classifier 0.7 points at 32x on both seeds: docs/COMPRESS.md; not kept.)"""
        self.gates.freeze(self.schedule.stage != "early" and self.objective.late == "budget")

    def announce(self, trainer: pl.Trainer) -> None:
        """Fix the default stages from the Trainer's length; say how long they are, or why nothing will be compressed."""
        total = _run_length(trainer)[0] if self.trained and not self.schedule.lengths_given else None
        if total:
            rank_zero_info(f"ComeraCallback: {self.schedule.resolve_trained(total, TRAINED_EARLY_SHARE, TRAINED_LATE_SHARE, trainer.max_epochs)}")
            return
        infos, warnings_ = self.schedule.resolve(trainer.max_epochs, trainer.max_steps)
        for message in infos:
            rank_zero_info(f"ComeraCallback: {message}")
        for message in warnings_:
            rank_zero_warn(f"ComeraCallback: {message}")

    def end_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a training batch: dead gates latched (a compiled forward does not), then the step-based event due, if any."""
        latch_dead_gates_(self.objective.bank)
        self.carry_out(self.schedule.after_batch(trainer.global_step), trainer, pl_module, trainer.current_epoch + 1)

    def end_epoch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epochs_done: int) -> None:
        """After ``epochs_done`` epochs (their validation included): the epoch-based event due, then the W&B rank table."""
        self.carry_out(self.schedule.after_epoch(epochs_done), trainer, pl_module, epochs_done)
        log_rank_table(trainer)

    def carry_out(self, event: str | None, trainer: pl.Trainer, pl_module: pl.LightningModule, epochs_done: int) -> None:
        """Do what the schedule decided: switch (then prune), prune, or prune and end the late stage."""
        if event == "switch":
            metrics = trainer.callback_metrics
            reference = self.loss_target.reference(metrics)
            self.objective.enter_late(mean_over_ranks(trainer, self.loss_target.resolve(metrics)),
                                      None if reference is None else mean_over_ranks(trainer, reference))
            self.schedule.enter_late(epochs_done, trainer.global_step)
            budget = self.objective.late == "budget"
            self.schedule.plan_late(*_run_length(trainer), prunes=BUDGET_PRUNES if budget else None, shrink_share=BUDGET_SHRINK_SHARE)
            self.hold_gates()
            rank_zero_info(f"ComeraCallback: late stage from step {trainer.global_step}: {self.objective.describe()}.")
        if event is not None:
            summary = self.prune(trainer, pl_module, PRUNE_REASONS[event])
            self.rank0_reported = warn_rank0(summary.ranks, self.rank0_reported, early=event in ("switch", "end"))
        if event in ("finish", "end"):
            self.schedule.enter_final()
            if event == "finish":
                rank_zero_info(f"ComeraCallback: late stage done at step {trainer.global_step}; training on the task loss only.")

    def shrink(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The budget's late stage: cut the least important ranks down to this prune's size, unless the guard holds them."""
        if self.objective.late != "budget" or self.schedule.stage != "late" or trainer.global_step == self.schedule.late_start_step:
            return
        watch = self.objective.watch
        stats = watch.window()
        if stats is not None and trainer.world_size > 1:
            stats = WindowStats(mean_over_ranks(trainer, value) for value in stats)
        if self.objective.guard.paused or not watch.allows(stats):
            self.held_at.append(trainer.global_step)
            if not self.objective.guard.paused:
                rank_zero_info(f"ComeraCallback: cut held at step {trainer.global_step}: the training loss since the last "
                               f"prune, {stats.mean:.4f} ± {stats.error:.4f}, is more than loss_tolerance={watch.tolerance} "
                               f"above its level before the cuts, {watch.best:.4f}.")
            return
        target = self.objective.target_size(self.schedule.late_progress(trainer.global_step))
        follow = state_follower(trainer.optimizers, self.gates) if self.cut == "svd" else None
        shrink_to_([layer for _, layer in tt_layers(pl_module)], target, self.gates.importance_of, on_align=follow)

    def prune(self, trainer: pl.Trainer, pl_module: pl.LightningModule, reason: str) -> PruneSummary:
        """Slice dead ranks out of the module and every optimizer's state, re-wrap DDP, tell the strategy, say what went."""
        self.shrink(trainer, pl_module)
        summary = prune_(pl_module, [*trainer.optimizers, *self.gates.optimizers()])
        self.schedule.record_prune(trainer.global_step)
        if summary.removed:
            rewrap_ddp(trainer)
        if isinstance(trainer.strategy, ResizeListener):
            trainer.strategy.on_parameters_resized()  # e.g. CUDAGraphStrategy re-captures
        publish_sizes(trainer, pl_module)
        if summary.removed or reason != PRUNE_REASONS["prune"]:  # an interval that cut nothing (size reached) is quiet
            rank_zero_info(
                f"ComeraCallback: prune ({reason}) at step {trainer.global_step}: "
                f"{summary.parameters_before:,} → {summary.parameters_after:,} parameters."
            )
        return summary

    def after_validation(self, trainer: pl.Trainer) -> None:
        """After a validation: L₀ from it after a step-based switch; the guarded late stage's quality check."""
        self.refresh_loss_target(trainer)
        self.guard_quality(trainer)

    def refresh_loss_target(self, trainer: pl.Trainer) -> None:
        """A validation at the step of a step-based switch ran after it: take L₀ from it, as an epoch-based switch would."""
        at_switch = self.schedule.stage == "late" and self.schedule.late_start_step == trainer.global_step
        if self.loss_target.refreshable and at_switch and not trainer.sanity_checking:
            self.objective.loss_target = mean_over_ranks(trainer, self.loss_target.resolve(trainer.callback_metrics))
            self.objective.guard.start(mean_over_ranks(trainer, self.loss_target.quality(trainer.callback_metrics)))
            rank_zero_info(f"ComeraCallback: L₀={self.objective.loss_target:.4f} from the validation at the stage switch.")

    def guard_quality(self, trainer: pl.Trainer) -> None:
        """Guarded late stage, after a validation: pause rank shrinking while the loss is worse than its best, resume after."""
        after_switch = self.schedule.stage == "late" and trainer.global_step > (self.schedule.late_start_step or 0)
        if self.objective.late not in ("guarded", "budget") or not after_switch or trainer.sanity_checking:
            return
        change = self.objective.guard.after_validation(mean_over_ranks(trainer, self.loss_target.quality(trainer.callback_metrics)))
        if change is not None:
            rank_zero_info(f"ComeraCallback: {change}.")


    def report_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """At the end of training: the ranks per layer to a CSV in the log folder, the size against the budget's."""
        path = write_rank_table(trainer, pl_module)
        line = self.report_budget(pl_module)
        if line is not None or path is not None:
            rank_zero_info(f"ComeraCallback: {line or ''}{f' Ranks per layer: {path}.' if path else ''}".strip())

    def report_budget(self, pl_module: pl.LightningModule) -> str | None:
        """At the end of training: the size reached against the budget's, in one line (None without a budget's late stage)."""
        if self.objective.late != "budget" or self.objective.size_target is None:
            return None
        reached = float(active_size([layer for _, layer in tt_layers(pl_module)]))
        asked = self.objective.size_asked or self.objective.size_target  # a checkpoint from before size_asked: the target
        line = f"tensorized layers end at {reached:,.0f} parameters, the budget asked {asked:,.0f} ({reached / asked - 1:+.1%})"
        if reached < asked * (1 - BUDGET_TOLERANCE):
            return line + ": they started below it (their rank caps reach no higher: the warning at the start says why)."
        if reached <= asked * (1 + BUDGET_TOLERANCE):
            return line + "."
        if self.held_at:
            return (line + f": the quality guard held the shrinking at step(s) {self.held_at} (the training loss since the "
                    f"last cut, or the validation loss, was more than loss_tolerance={self.objective.guard.tolerance} above "
                    "its best); raise loss_tolerance or give the late stage more steps to reach it.")
        return line + ": every bond is at its last rank (allow_rank0=True lets layers go) or the late stage ended early."


#: A budget counts as reached within this fraction above the size asked.
BUDGET_TOLERANCE = 0.1


def _run_length(trainer: pl.Trainer) -> tuple[float | None, float | None]:
    """The fit's optimizer steps in all, and per epoch (None where the Trainer does not know)."""
    total = trainer.estimated_stepping_batches
    total = None if total is None or total == float("inf") else float(total)
    per_epoch = total / trainer.max_epochs if total and trainer.max_epochs and trainer.max_epochs > 0 else None
    return total, per_epoch


#: What to change when ranks die, by the stage they died in.
RANK0_ADVICE = {
    True: "They died in the early stage: lower gate_lr or rank_weight (target_ratio plays no part there).",
    False: "They died in the late stage: if that is too much, raise target_ratio, lower loss_tolerance or lower gate_lr.",
}


def warn_rank0(ranks: dict[str, tuple[int, ...]], reported: set[str], early: bool = False) -> set[str]:
    """Warn once per layer whose bond reached rank 0 (it then adds only its bias), and when all did; returns all reported.

    ``early``: the ranks died in the early stage (the advice names that stage's knobs).
    """
    dead = {name for name, bonds in ranks.items() if 0 in bonds}
    if dead - reported:
        everything = " Every tensorized layer is pruned to zero: the model ignores their inputs." if dead == set(ranks) else ""
        rank_zero_warn(
            f"ComeraCallback: {sorted(dead - reported)} pruned to rank 0 on a bond: each now outputs its bias only."
            f"{everything} {RANK0_ADVICE[early]}"
        )
    return reported | dead
