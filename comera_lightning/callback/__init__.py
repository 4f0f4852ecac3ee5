"""ComeraCallback: rank-adaptive two-stage tensor-train training (CoMERA) for any LightningModule.

A thin adapter from Lightning's hooks to plain objects (docs/DESIGN.md): ``tensorize`` swaps the
chosen layers at ``setup`` (or right after ``configure_model``), before the optimizers and DDP
exist; :class:`~comera_lightning.schedule.StageSchedule` decides when stages switch and ranks
are pruned; :class:`~comera_lightning.schedule.ComeraObjective` turns the module's task loss into
the stage's objective (docs/METHOD.md §2); :class:`~comera_lightning.schedule.LossTarget` picks
L₀; ``rank.prune_`` slices dead ranks out of the cores and the optimizer state.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from typing_extensions import override

from comera_lightning.checkpoint import install_checkpoint_loading
from comera_lightning.callback.metrics import compression_metrics, log_rank_table, warn_rank0
from comera_lightning.data.resumable import record_consumed_batches
from comera_lightning.optim.gates import DEFAULT_GATE_LR, GateOptimizer, drop_gates_from_saved_states
from comera_lightning.callback.hooks import non_finite_error, replace_loss, unwrap_methods, wrap_method
from comera_lightning.rank import prune_, tt_layers
from comera_lightning.checkpoint.resume import capture_rng_state, missed_epoch_end, restore_rng_state, run_missed_validation
from comera_lightning.checkpoint.settings import callback_settings, warn_changed_settings
from comera_lightning.schedule import ComeraObjective, LossTarget, StageSchedule
from comera_lightning.schedule.legacy import from_flat_state
from comera_lightning.tensorize import tensorize
from comera_lightning.tensorize.config import TensorizeConfig
from comera_lightning.callback.trainer import capturing, check_supported, mean_over_ranks, rewrap_ddp, use_atomic_checkpoints

__all__ = ["ComeraCallback"]


class ComeraCallback(Callback):
    """Train the model's chosen layers in TT form with ranks that shrink (CoMERA), for any LightningModule.

    Which layers and how: ``tensorize`` (a :class:`TensorizeConfig`, the CLI's ``comera.tensorize``);
    ``max_rank``, ``target_modules``, ``exclude_modules``, ``gate_threshold`` may be given directly.
    Schedule (:class:`StageSchedule`): ``early_epochs``/``early_steps`` (default: 2/3 of
    ``max_epochs``), ``late_epochs``/``late_steps`` (default: to the end), pruned at the switch and
    every ``prune_every_n_epochs`` (default 1) or ``prune_every_n_steps``. L₀: ``loss_target`` or
    ``loss_target_metric`` (:class:`LossTarget`). The rank gates get the callback's own Adam at
    ``gate_lr`` (:class:`GateOptimizer`), whatever ``configure_optimizers`` returns. Manual
    optimization: ``allow_manual_optimization=True`` and ``loss = callback.objective(loss)``.
    ``log_bond_ranks``: ``True``/``"layer"`` logs each TT layer's mean active rank, ``"bond"`` every bond's.
    """

    def __init__(
        self,
        max_rank: int | list[int] | None = None,
        target_modules: str | list[str] | None = None,
        exclude_modules: str | list[str] | None = None,
        early_epochs: int | None = None,
        target_ratio: float = 0.2,
        rank_weight: float = 0.01,
        gate_threshold: float | None = None,
        *,
        gate_lr: float = DEFAULT_GATE_LR,
        tensorize: TensorizeConfig | None = None,
        early_steps: int | None = None,
        late_epochs: int | None = None,
        late_steps: int | None = None,
        loss_target: float | None = None,
        loss_target_metric: str | None = None,
        loss_weight: float = 0.1,
        size_weight: float = 0.01,
        prune_every_n_epochs: int | None = None,
        prune_every_n_steps: int | None = None,
        size_surrogate: str = "mean",
        log_bond_ranks: bool | Literal["layer", "bond"] = True,
        check_finite_loss: bool = True,
        allow_manual_optimization: bool = False,
        **tensorize_options: Any,
    ) -> None:
        super().__init__()
        shortcuts = dict(max_rank=max_rank, target_modules=target_modules, exclude_modules=exclude_modules, gate_threshold=gate_threshold)
        self.tensorize_config = _tensorize_config(tensorize, shortcuts, tensorize_options)
        self.schedule = StageSchedule(early_epochs, early_steps, late_epochs, late_steps, prune_every_n_epochs, prune_every_n_steps)
        self.stage_objective = ComeraObjective(target_ratio, rank_weight, loss_weight, size_weight, size_surrogate)
        self.loss_target = LossTarget(loss_target, loss_target_metric)
        self.gate_optimizer = GateOptimizer(gate_lr)
        self.log_bond_ranks, self.check_finite_loss = log_bond_ranks, check_finite_loss
        self.allow_manual_optimization = allow_manual_optimization
        self._trainer: pl.Trainer | None = None
        self._validated = False  # a (non-sanity) validation has run in this fit
        self._rank0_reported: set[str] = set()
        self._resuming: dict[str, Any] | None = None
        self._resumed_state: dict[str, Any] = {}  # RNG and L₀ running mean of the checkpoint, put back at on_train_start
        self._rng_for_first_batch: dict[str, Any] | None = None

    # ------------------------------------------------------------------ read-outs
    stage = property(lambda self: self.schedule.stage, doc='``"early"``, ``"late"`` or ``"final"``.')
    prune_events = property(lambda self: self.schedule.prune_events, doc="How many prunes have run.")
    loss_target_value = property(lambda self: self.stage_objective.loss_target, doc="L₀ of the late stage (None before).")
    size_target = property(lambda self: self.stage_objective.size_target, doc="S₀ of the late stage (None before).")

    def cuda_graph_signature(self) -> tuple:
        """What a captured training step freezes from this callback (CUDAGraphStrategy re-captures when it changes)."""
        return (self.schedule.stage, self.stage_objective.loss_target, self.stage_objective.size_target)

    # ------------------------------------------------------------------ setup / teardown
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check the run is supported; tensorize now, or right after ``configure_model`` when the module has one."""
        self._trainer = trainer
        check_supported(trainer, pl_module, self.allow_manual_optimization)
        use_atomic_checkpoints(trainer)
        if is_overridden("configure_model", pl_module, pl.LightningModule):
            wrap_method(pl_module, "configure_model", lambda result: self._tensorize(pl_module))
        else:
            self._tensorize(pl_module)
        if stage == "fit":
            self._validated = False
            infos, warnings_ = self.schedule.resolve(trainer.max_epochs)
            for message in infos:
                rank_zero_info(f"ComeraCallback: {message}")
            for message in warnings_:
                rank_zero_warn(f"ComeraCallback: {message}")
            if pl_module.automatic_optimization:
                wrap_method(pl_module, "training_step", lambda output: replace_loss(output, self.objective))

    def _tensorize(self, pl_module: pl.LightningModule) -> None:
        report = tensorize(pl_module, self.tensorize_config)
        if report.swapped:
            rank_zero_info(str(report))
        self.stage_objective.bind([m for _, m in tt_layers(pl_module)])
        install_checkpoint_loading(type(pl_module))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The optimizers exist now: take the gates over (before Lightning restores the optimizers' state)."""
        gates = [g for _, layer in tt_layers(pl_module) for g in layer.gates]
        self.gate_optimizer.attach(gates, trainer.optimizers)
        if self._resuming is not None:  # Lightning restores the optimizers' state after this hook
            drop_gates_from_saved_states(self._resuming.get("optimizer_states", []), self.gate_optimizer.removed)
            self._resuming = None
        self.gate_optimizer.follow_scaler(getattr(trainer.precision_plugin, "scaler", None))

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """On resume: continue where the checkpointed run was (its RNG, L₀ mean, and an epoch end Lightning skips)."""
        state, self._resumed_state = self._resumed_state, {}
        if not state:
            return
        self.loss_target.load_state_dict(state["loss_target"], pl_module.device)
        restore_rng_state(state["rng"])
        if missed_epoch_end(trainer, self.schedule.epochs_ended):
            run_missed_validation(trainer, trainer.current_epoch - 1)
            self._end_epoch(trainer, pl_module, trainer.current_epoch)
            self.on_train_epoch_start(trainer, pl_module)
        self._rng_for_first_batch = capture_rng_state()  # Lightning's resume bookkeeping may draw before that batch

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        """The first batch after a resume draws the random numbers the interrupted run would have drawn."""
        if self._rng_for_first_batch is not None:
            restore_rng_state(self._rng_for_first_batch)
            self._rng_for_first_batch = None

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Keep the checkpoint being resumed until ``on_fit_start`` (one from before 0.2 has the gates in the optimizer state)."""
        self._resuming = checkpoint

    @override
    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        """Clear the gates' gradients with the module's (they stay when a step was skipped)."""
        self.gate_optimizer.zero_grad()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give the module its own methods back; stop following its optimizer."""
        self.gate_optimizer.detach()
        unwrap_methods(pl_module)
        self._resumed_state, self._rng_for_first_batch = {}, None

    # ------------------------------------------------------------------ objective
    def objective(self, task_loss: torch.Tensor) -> torch.Tensor:
        """The current stage's training objective for a task loss ``L`` (docs/METHOD.md §2)."""
        if self.check_finite_loss and not capturing() and not bool(torch.isfinite(task_loss.detach()).all()):
            raise non_finite_error(task_loss, self._trainer)
        loss = self.stage_objective(task_loss, self.schedule.stage)
        self.loss_target.observe(self.stage_objective.last["task_loss"])
        return loss

    # ------------------------------------------------------------------ schedule events
    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start a fresh per-epoch training-loss mean (a possible L₀); a misspelt L₀ metric fails here, not at the switch."""
        self.loss_target.reset_epoch(pl_module.device)
        if self._validated and self.schedule.stage == "early":
            self.loss_target.check_logged(trainer.callback_metrics, f"by the end of epoch {trainer.current_epoch - 1}, validation included")

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Step-based stage switches and pruning, then the compression curves."""
        self._carry_out(self.schedule.after_batch(trainer.global_step), trainer, pl_module, trainer.current_epoch + 1)
        if getattr(trainer._logger_connector, "should_update_logs", True):
            metrics = compression_metrics(pl_module, self.schedule.stage, self.stage_objective.last, self.log_bond_ranks)
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Epoch-based stage switches and pruning (this epoch's validation has run), then the W&B rank table."""
        self._end_epoch(trainer, pl_module, trainer.current_epoch + 1)

    def _end_epoch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epochs_done: int) -> None:
        self._carry_out(self.schedule.after_epoch(epochs_done), trainer, pl_module, epochs_done)
        log_rank_table(trainer)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation at the step of a step-based switch ran after it: take L₀ from it, as an epoch-based switch would."""
        self._validated = self._validated or not trainer.sanity_checking
        schedule = self.schedule
        at_switch = schedule.stage == "late" and schedule.late_start_step == trainer.global_step
        if self.loss_target.refreshable and at_switch and not trainer.sanity_checking:
            self.stage_objective.loss_target = mean_over_ranks(trainer, self.loss_target.resolve(trainer.callback_metrics))
            rank_zero_info(f"ComeraCallback: L₀={self.stage_objective.loss_target:.4f} from the validation at the stage switch.")

    def _carry_out(self, event: str | None, trainer: pl.Trainer, pl_module: pl.LightningModule, epochs_done: int) -> None:
        if event == "switch":
            self.stage_objective.enter_late(mean_over_ranks(trainer, self.loss_target.resolve(trainer.callback_metrics)))
            self.schedule.enter_late(epochs_done, trainer.global_step)
            rank_zero_info(f"ComeraCallback: late stage from step {trainer.global_step}: {self.stage_objective.describe()}.")
            self._prune(trainer, pl_module, "stage switch")
        elif event == "finish":
            self._prune(trainer, pl_module, "end of late stage")
            self.schedule.enter_final()
            rank_zero_info(f"ComeraCallback: late stage done at step {trainer.global_step}; training on the task loss only.")
        elif event == "prune":
            self._prune(trainer, pl_module, "interval")

    def _prune(self, trainer: pl.Trainer, pl_module: pl.LightningModule, reason: str) -> None:
        summary = prune_(pl_module, [*trainer.optimizers, *self.gate_optimizer.optimizers()])
        self.schedule.record_prune(trainer.global_step)
        if summary.removed:
            rewrap_ddp(trainer)
        getattr(trainer.strategy, "on_parameters_resized", lambda: None)()  # e.g. CUDAGraphStrategy re-captures
        rank_zero_info(
            f"ComeraCallback: prune ({reason}) at step {trainer.global_step}: "
            f"{summary.parameters_before:,} → {summary.parameters_after:,} parameters."
        )
        self._rank0_reported = warn_rank0(summary.ranks, self._rank0_reported)

    # ------------------------------------------------------------------ checkpoints
    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Record how the model was tensorized; tell resumable loaders how many batches this epoch consumed."""
        checkpoint["comera"] = {"tensorize": self.tensorize_config.to_dict()}
        loader_states = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader", [])
        record_consumed_batches(loader_states, trainer.fit_loop.epoch_loop.batch_progress.current.ready)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Schedule progress, the objective's targets, the gates' optimizer, L₀'s running mean and the RNG (ranks travel in the model)."""
        return {
            "schedule": self.schedule.state_dict(), "objective": self.stage_objective.state_dict(),
            "gates": self.gate_optimizer.state_dict(), "loss_target": self.loss_target.state_dict(), "rng": capture_rng_state(),
            "settings": callback_settings(self),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved (also the flat layout of checkpoints written before 0.2)."""
        state = state_dict if "schedule" in state_dict else from_flat_state(state_dict)
        unknown = set(state) - set(_STATE_KEYS)
        if unknown:
            raise KeyError(f"ComeraCallback state has unknown keys {sorted(unknown)}; expected {list(_STATE_KEYS)}.")
        warn_changed_settings(state.get("settings"), callback_settings(self))
        self.schedule.load_state_dict(state["schedule"])
        self.stage_objective.load_state_dict(state["objective"])
        self.gate_optimizer.load_state_dict(state.get("gates"))
        if "rng" in state:  # written by 0.3 and later
            self._resumed_state = {"loss_target": state["loss_target"], "rng": state["rng"]}


# ---------------------------------------------------------------------- helpers
_STATE_KEYS = ("schedule", "objective", "gates", "loss_target", "rng", "settings")
SHORTCUTS = ("max_rank", "target_modules", "exclude_modules", "gate_threshold")  # tensorize options the callback takes directly
#: The other tensorize options, still accepted as keywords (deprecated): ``tensorize=TensorizeConfig(...)``.
LEGACY_TENSORIZE_OPTIONS = tuple(name for name in TensorizeConfig.option_names() if name not in SHORTCUTS)


def _tensorize_config(config: TensorizeConfig | Mapping[str, Any] | None, shortcuts: dict[str, Any], legacy: dict[str, Any]) -> TensorizeConfig:
    """The callback's TensorizeConfig: ``config`` with the direct arguments given (not None) applied."""
    unknown = sorted(set(legacy) - set(LEGACY_TENSORIZE_OPTIONS))
    if unknown:
        known = [*inspect.signature(ComeraCallback).parameters, *LEGACY_TENSORIZE_OPTIONS]
        hints = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
        raise TypeError(
            "ComeraCallback got unexpected keyword argument(s) "
            + ", ".join(f"{name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "") for name, hint in hints.items())
        )
    if legacy:
        warnings.warn(
            f"ComeraCallback({', '.join(f'{k}=...' for k in legacy)}) is deprecated: pass tensorize=TensorizeConfig(...) "
            "(in a CLI config, the comera.tensorize section).",
            DeprecationWarning,
            stacklevel=3,
        )
    if isinstance(config, Mapping):
        config = TensorizeConfig.from_dict(config)
    changes = {**{k: v for k, v in shortcuts.items() if v is not None}, **legacy}
    return (config if config is not None else TensorizeConfig()).replace(**changes)
