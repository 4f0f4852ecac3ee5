"""ComeraCallback: rank-adaptive two-stage tensor-train training (CoMERA) for any LightningModule.

A thin adapter from Lightning's hooks to plain objects (docs/DESIGN.md): ``tensorize`` swaps the
chosen layers at ``setup`` (or right after ``configure_model``), before the optimizers and DDP
exist; :class:`~comera_lightning.schedule.StageSchedule` decides when stages switch and ranks are
pruned, and ``events.py`` carries that out (``rank.prune_`` slices the cores and the optimizer
state); :class:`~comera_lightning.schedule.ComeraObjective` turns the module's task loss into the
stage's objective (docs/METHOD.md §2); :class:`~comera_lightning.schedule.LossTarget` picks L₀.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from comera_lightning.callback.distill import DistillConfig, Teacher
from comera_lightning.callback.events import StageEvents
from comera_lightning.callback.hooks import non_finite_error, replace_loss, unwrap_methods, when_built, wrap_method
from comera_lightning.callback.metrics import compression_metrics
from comera_lightning.callback.trainer import (annotate_checkpoint, check_supported, logs_this_step, syncs_forbidden,
                                               use_atomic_checkpoints)
from comera_lightning.checkpoint import install_checkpoint_loading
from comera_lightning.checkpoint.resume import ResumeState, capture_rng_state, missed_epoch_end, run_missed_validation
from comera_lightning.checkpoint.settings import callback_settings, warn_changed_settings
from comera_lightning.layers.halves_group import group_halves
from comera_lightning.optim.core_steps import DEFAULT_CORE_STEP_SCALE, CoreStepScale, CoreStepScaleArg
from comera_lightning.optim.gates import GateOptimizer
from comera_lightning.rank import beside_cores, compression_stats, tt_layers
from comera_lightning.schedule import BudgetConfig, ComeraObjective, LossTarget, StageSchedule
from comera_lightning.tensorize import skipped_layers, tensorize
from comera_lightning.tensorize.build import pin_trained_tables
from comera_lightning.tensorize.config import TensorizeConfig

__all__ = ["ComeraCallback", "DistillConfig"]


class ComeraCallback(Callback):
    """Train the model's chosen layers in TT form with ranks that shrink (CoMERA), for any LightningModule.

    The stages and their objectives: docs/METHOD.md §2. Manual optimization: ``loss = callback.objective(loss)``.

    Args:
        max_rank: largest TT rank of each bond (an int, or one per bond); None: the tensorize config's (a quarter of each layer's smaller side by default).
        target_modules: layers to tensorize, by name or dotted suffix (a list) or one regex; None: every supported layer but heads.
        exclude_modules: layers to leave dense, the same kind of rule; None: none.
        early_epochs: epochs of the early stage; None: the budget config's (two thirds of the Trainer's max_epochs or max_steps).
        target_ratio: the size asked at the end, as a fraction of the TT layers' size at the switch; None: the budget config's.
        rank_weight: γ, the weight of the size surrogate R in the early stage's objective L + γR; None: the budget config's.
        gate_threshold: a rank gate at or below this is dead and pruned; None: the tensorize config's (0.01 by default).
        budget: how small the TT layers end, when they shrink, what they may not lose (``BudgetConfig``; the CLI's
            comera.budget section); None: the defaults. The arguments early_steps ... size_surrogate below, like
            early_epochs, target_ratio and rank_weight above, override its fields of the same name (None: its value).
        core_step_scale: under an Adam-like optimizer, how far TT cores move per step relative to the optimizer's step: "auto" (the default) moves the cores of token tables and vocabulary heads 12 times as far (4 from trained weights, init="svd", to a budget of at most 4x) and leaves every other layer's alone; a number applies to every TT layer (1: the optimizer's own steps). SGD steps stay (docs/METHOD.md §2.2).
        tensorize: which layers become tensor trains and how (the CLI's comera.tensorize section); None: the defaults.
        distill: compressing a trained model, its frozen dense copy as the teacher of its tensorized self (``DistillConfig``); None: none.
        log_bond_ranks: True or "layer": log each TT layer's mean active rank; "bond": every bond's; False: no ranks.
        check_finite_loss: stop with a clear error, before the step's backward, when the task loss is NaN or inf.
        allow_manual_optimization: accept a module with manual optimization (it calls callback.objective itself).
    """

    def __init__(
        self,
        max_rank: int | list[int] | None = None,
        target_modules: str | list[str] | None = None,
        exclude_modules: str | list[str] | None = None,
        early_epochs: int | None = None,
        target_ratio: float | None = None,
        rank_weight: float | None = None,
        gate_threshold: float | None = None,
        *,
        budget: BudgetConfig | None = None,
        core_step_scale: CoreStepScaleArg = DEFAULT_CORE_STEP_SCALE,
        tensorize: TensorizeConfig | None = None,
        distill: DistillConfig | Mapping[str, Any] | None = None,
        gate_lr: float | None = None,
        early_steps: int | None = None,
        late_epochs: int | None = None,
        late_steps: int | None = None,
        late_objective: Literal["budget", "guarded", "paper"] | None = None,
        loss_tolerance: float | None = None,
        loss_target: float | None = None,
        loss_target_metric: str | None = None,
        loss_weight: float | None = None,
        size_weight: float | None = None,
        prune_every_n_epochs: int | None = None,
        prune_every_n_steps: int | None = None,
        size_surrogate: str | None = None,
        log_bond_ranks: bool | Literal["layer", "bond"] = True,
        check_finite_loss: bool = True,
        allow_manual_optimization: bool = False,
    ) -> None:
        super().__init__()
        shortcuts = dict(max_rank=max_rank, target_modules=target_modules, exclude_modules=exclude_modules, gate_threshold=gate_threshold)
        self.tensorize_config = _tensorize_config(tensorize, shortcuts)
        given = {k: v for k, v in locals().items() if k in BudgetConfig.option_names()}
        self.budget_config = b = _budget_config(budget, given)
        self.schedule = StageSchedule(b.early_epochs, b.early_steps, b.late_epochs, b.late_steps, b.prune_every_n_epochs, b.prune_every_n_steps)
        self.stage_objective = _stage_objective(b)
        self.loss_target = LossTarget(b.loss_target, b.loss_target_metric)
        self.gate_optimizer = GateOptimizer(b.gate_lr, follow_schedule=b.late_objective != "paper")
        self.core_steps = CoreStepScale(core_step_scale)
        trained = self.tensorize_config.init == "svd" and b.late_objective == "budget"  # the trained-model schedule
        self.events = StageEvents(self.schedule, self.stage_objective, self.loss_target, self.gate_optimizer, b.cut, trained)
        self.teacher = Teacher(distill)
        self.log_bond_ranks, self.check_finite_loss, self.allow_manual_optimization = log_bond_ranks, check_finite_loss, allow_manual_optimization
        self._trainer: pl.Trainer | None = None
        self._validated = False  # a (non-sanity) validation has run in this fit
        self._resume = ResumeState()  # a checkpoint's RNG and L₀ running mean, put back when training starts

    stage = property(lambda self: self.schedule.stage, doc='``"early"``, ``"late"`` or ``"final"``.')
    prune_events = property(lambda self: self.schedule.prune_events, doc="How many prunes have run.")
    loss_target_value = property(lambda self: self.stage_objective.loss_target, doc="L₀ of the late stage (None before).")
    size_target = property(lambda self: self.stage_objective.size_target, doc="S₀ of the late stage (None before).")

    def cuda_graph_signature(self) -> tuple:
        """What a captured training step freezes from this callback (CUDAGraphStrategy re-captures when it changes)."""
        return (self.schedule.stage, self.stage_objective.loss_target, self.stage_objective.size_target)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check the run is supported; tensorize now, or right after ``configure_model`` when the module has one."""
        self._trainer = trainer
        check_supported(trainer, pl_module, self.allow_manual_optimization)
        use_atomic_checkpoints(trainer)
        when_built(pl_module, lambda: setattr(self, "tensorize_config", _tensorize_module(
            pl_module, self.tensorize_config, self.stage_objective, self.budget_config, self.teacher)))
        if stage == "fit":
            self._validated = False
            self.events.announce(trainer)
            if pl_module.automatic_optimization:
                wrap_method(pl_module, "training_step", lambda output: replace_loss(output, self.objective))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The optimizers exist now: take the gates over, scale the cores' steps (before Lightning restores the optimizers' state)."""
        layers = [layer for _, layer in tt_layers(pl_module)]
        self.gate_optimizer.attach([g for layer in layers for g in layer.gates], trainer.optimizers,
                                   after_step=self.stage_objective.bank.latch_)
        self.gate_optimizer.follow_scaler(getattr(trainer.precision_plugin, "scaler", None))
        self.events.hold_gates()
        _stretch_core_steps(self.core_steps, pl_module, layers, trainer.optimizers, self.budget_config, self.tensorize_config)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """On resume: continue where the checkpointed run was (its RNG, L₀ mean, and an epoch end Lightning skips)."""
        if not self._resume.start(self.loss_target, pl_module.device):
            return
        if missed_epoch_end(trainer, self.schedule.epochs_ended):
            run_missed_validation(trainer, trainer.current_epoch - 1)
            self.events.end_epoch(trainer, pl_module, trainer.current_epoch)
            self.on_train_epoch_start(trainer, pl_module)
        self._resume.hold_rng_for_first_batch()  # Lightning's resume bookkeeping may draw before that batch

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        """The first batch after a resume draws the random numbers the interrupted run would have drawn."""
        self._resume.before_first_batch(trainer)

    @override
    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        """Clear the gates' gradients with the module's (they stay when a step was skipped)."""
        self.gate_optimizer.zero_grad()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Where the ranks ended (``comera_ranks.csv`` in the log folder, W&B's table) and the size against the budget's."""
        self.events.report_end(trainer, pl_module)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give the module its own methods back; stop following its optimizer."""
        self.gate_optimizer.detach()
        self.core_steps.detach()
        self.teacher.detach_hook()
        unwrap_methods(pl_module)
        self._resume = ResumeState()

    def objective(self, task_loss: torch.Tensor) -> torch.Tensor:
        """The current stage's training objective for a task loss ``L`` (docs/METHOD.md §2)."""
        if self.check_finite_loss and not syncs_forbidden() and not bool(torch.isfinite(task_loss.detach()).all()):
            raise non_finite_error(task_loss, self._trainer)
        loss = self.stage_objective(task_loss, self.schedule.stage)
        self.loss_target.observe(self.stage_objective.last["task_loss"])
        return self.teacher.mix(loss, task_loss)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start a fresh per-epoch training-loss mean (a possible L₀); a misspelt L₀ metric fails here, not at the switch."""
        self.loss_target.reset_epoch(pl_module.device)
        if self._validated and self.schedule.stage == "early":
            self.loss_target.check_logged(trainer.callback_metrics, f"by the end of epoch {trainer.current_epoch - 1}, validation included")

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Step-based stage switches and pruning, then the compression curves."""
        self.events.end_batch(trainer, pl_module)
        if logs_this_step(trainer):
            metrics = compression_metrics(pl_module, self.schedule.stage, self.stage_objective.last, self.log_bond_ranks)
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Epoch-based stage switches and pruning (this epoch's validation has run), then the W&B rank table."""
        self.events.end_epoch(trainer, pl_module, trainer.current_epoch + 1)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Note that a validation ran; after a step-based switch, take L₀ from it; the guarded late stage checks quality."""
        self._validated = self._validated or not trainer.sanity_checking
        self.events.after_validation(trainer)

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Record how the model was tensorized; tell resumable loaders how many batches this epoch consumed."""
        annotate_checkpoint(checkpoint, trainer, self.tensorize_config)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Schedule progress, the objective's targets, the gates' optimizer, L₀'s running mean and the RNG (ranks travel in the model)."""
        return {"schedule": self.schedule.state_dict(), "objective": self.stage_objective.state_dict(),
                "gates": self.gate_optimizer.state_dict(), "loss_target": self.loss_target.state_dict(),
                "rng": capture_rng_state(), "settings": callback_settings(self)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved; the settings given now win, with one warning for each that differs."""
        unknown = set(state_dict) - set(_STATE_KEYS)
        if unknown:
            raise KeyError(f"ComeraCallback state has unknown keys {sorted(unknown)}; expected {list(_STATE_KEYS)}.")
        self.teacher.refuse_resume()
        warn_changed_settings(state_dict.get("settings"), callback_settings(self))
        self.schedule.load_state_dict(state_dict["schedule"])
        self.stage_objective.load_state_dict(state_dict["objective"])
        self.gate_optimizer.load_state_dict(state_dict["gates"])
        self._resume.hold(state_dict["loss_target"], state_dict["rng"])


# ---------------------------------------------------------------------- helpers
_STATE_KEYS = ("schedule", "objective", "gates", "loss_target", "rng", "settings")


def _tensorize_module(pl_module: pl.LightningModule, config: TensorizeConfig, objective: ComeraObjective,
                      budget: BudgetConfig, teacher: Teacher) -> TensorizeConfig:
    """Swap the module's layers for tensor trains (the teacher copies the dense model first), say what changed, bind
    the objective and the budget to them, load checkpoints into them; the config used (its caps scaled to the budget:
    ``BudgetConfig.start_caps``)."""
    teacher.attach(pl_module)
    caps = budget.start_caps(pl_module, config)
    # start_caps pins target_modules to the layers the user's config takes: the report still says why the others stay dense
    skipped = skipped_layers(pl_module, config) if caps.target_modules != config.target_modules else []
    report = tensorize(pl_module, caps)
    report.skipped = skipped + report.skipped  # the pinned run can only skip pinned names, never among these
    if report.swapped:
        rank_zero_info(str(report))
    layers = [m for _, m in tt_layers(pl_module)]
    for layer in layers:
        layer.allow_rank0 = budget.allow_rank0
    group_halves(layers)  # layers of one core layout contract their halves together, once a step
    objective.bind(layers)
    budget.end_size(0.0, compression_stats(pl_module), beside_cores(layers))  # a budget out of reach fails now
    objective.end_size = functools.partial(_budget_end_size, budget, pl_module, layers)  # picklable (ddp_spawn)
    install_checkpoint_loading(type(pl_module))
    return pin_trained_tables(caps, report.swapped)


def _budget_end_size(budget: BudgetConfig, pl_module: pl.LightningModule, layers: list, size_at_switch: float) -> float:
    return budget.end_size(size_at_switch, compression_stats(pl_module), beside_cores(layers))


def _stretch_core_steps(core_steps: CoreStepScale, pl_module: pl.LightningModule, layers: list, optimizers: list,
                        budget: BudgetConfig, config: TensorizeConfig) -> None:
    """Attach the core step rule to the TT ``layers`` and the ``optimizers``; from trained weights (``init="svd"``), how
    far the budget cuts them decides the token cores' stretch (``CoreStepScale.trained_compression``), and the log
    says which."""
    if config.init == "svd":
        core_steps.trained_compression = _compression_asked(pl_module, budget, layers)
    core_steps.attach(layers, optimizers)
    stretched = core_steps.stretched_layers()
    if stretched and core_steps.scale == "auto" and core_steps.trained_compression is not None:
        rank_zero_info(f"ComeraCallback: from trained weights, {core_steps.trained_compression:g}x smaller: the token "
                       f"cores move {core_steps.stretch_of(stretched[0]):g} times the optimizer's step.")


def _compression_asked(pl_module: pl.LightningModule, budget: BudgetConfig, layers: list) -> float:
    """How many times smaller than dense the budget ends the tensorized layers (a target_ratio: of their size now)."""
    if budget.asked_compression is not None:
        return budget.asked_compression
    stats = compression_stats(pl_module)
    return stats.dense_tt_parameters / max(1.0, budget.end_size(float(stats.tt_parameters), stats, beside_cores(layers)))


_SHORTCUTS = [name for name in BudgetConfig.option_names() if f"        {name}: " not in ComeraCallback.__doc__]
ComeraCallback.__doc__ = ComeraCallback.__doc__.rstrip() + "\n" + BudgetConfig.argument_docs(
    [name for name in inspect.signature(ComeraCallback).parameters if name in _SHORTCUTS])


def _stage_objective(b: BudgetConfig) -> ComeraObjective:
    return ComeraObjective(b.target_ratio or 1.0, b.rank_weight, b.loss_weight, b.size_weight, b.size_surrogate,
                           b.late_objective, b.loss_tolerance)


def _budget_config(config: BudgetConfig | Mapping[str, Any] | None, given: dict[str, Any]) -> BudgetConfig:
    """The callback's BudgetConfig: ``config`` with the direct arguments given (not None) applied."""
    if isinstance(config, Mapping):
        config = BudgetConfig.from_dict(config)
    return (config if config is not None else BudgetConfig()).replace(**{k: v for k, v in given.items() if v is not None})


def _tensorize_config(config: TensorizeConfig | Mapping[str, Any] | None, shortcuts: dict[str, Any]) -> TensorizeConfig:
    """The callback's TensorizeConfig: ``config`` with the direct arguments given (not None) applied."""
    if isinstance(config, Mapping):
        config = TensorizeConfig.from_dict(config)
    changes = {k: v for k, v in shortcuts.items() if v is not None}
    return (config if config is not None else TensorizeConfig()).replace(**changes)
