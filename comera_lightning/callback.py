"""ComeraCallback: rank-adaptive two-stage tensor-train training for any LightningModule.

METHOD.md §2. At ``setup`` the chosen layers are swapped for TT layers (before the optimizer
and DDP exist). The module's ``training_step`` output is wrapped so that the loss Lightning
backpropagates is the stage's objective:

* early stage: ``L + γ·R``;
* late stage: ``ρ_L·L + ρ_R·R + λ·R + (1−λ)·L`` with ``λ = 1[(L−L₀)/L < (S−S₀)/S]`` on device;
* after the late stage (only if its length is set): ``L``.

At the stage switch and then every ``prune_every_n_epochs``/``_steps`` the dead ranks are sliced
out of the cores and out of the optimizer state (``rank.prune_``), so compute and memory fall.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from .checkpoint import install_checkpoint_loading
from .rank import active_size, compression_stats, prune_, size_surrogate, surrogate_normalizer, tt_layers
from .tensorize import INIT_CHOICES, _validate_layer_config, tensorize

__all__ = ["ComeraCallback"]

log = logging.getLogger(__name__)
STAGES = ("early", "late", "final")
UNSUPPORTED_STRATEGIES = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy", "XLAStrategy", "SingleDeviceXLAStrategy")
AUTO_LOSS_METRICS = ("val/loss", "val_loss", "validation/loss", "valid/loss")
#: ``loss_target_metric`` value for the mean task loss of the early stage's last (possibly partial) epoch.
TRAIN_LOSS_TARGET = "train"


def _capturing() -> bool:
    """True while a CUDA graph is being captured, where a host sync (the finite-loss check) is not allowed."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_count(name: str, value: Any, minimum: int = 1) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be an integer >= {minimum} or None, got {value!r}.")


def _check_number(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else '∞'}{']' if high is not None else ')'}"
        raise ValueError(f"{name} must be a number in {bounds}, got {value!r}.")


class ComeraCallback(Callback):
    """Train the model's chosen layers in TT form with ranks that shrink (CoMERA), for any LightningModule.

    Schedules: ``early_epochs`` or ``early_steps`` (default: two thirds of ``max_epochs``), then a
    late stage of ``late_epochs``/``late_steps`` (default: until training ends), pruned at the
    stage switch and every ``prune_every_n_epochs`` (default 1) or ``prune_every_n_steps``. ``loss_target``
    is ``L₀``; by default the validation loss logged at the end of the early stage (or the
    early stage's last-epoch mean training loss when there is no validation), or the metric named
    by ``loss_target_metric``; ``loss_target_metric="train"`` takes that mean training loss even
    when a validation loss exists (the late stage compares L₀ with training losses, and a
    validation loss above them lets it trade the generalisation gap for size).
    Manual optimization: pass ``allow_manual_optimization=True`` and call
    ``callback.objective(loss)`` yourself before ``manual_backward``.
    """

    def __init__(
        self,
        max_rank: int | list[int] = 30,
        target_modules: str | list[str] | None = None,
        exclude_modules: str | list[str] | None = None,
        early_epochs: int | None = None,
        target_ratio: float = 0.2,
        rank_weight: float = 0.01,
        gate_threshold: float = 1e-2,
        *,
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
        embedding_max_rank: int | list[int] | None = None,
        num_cores: int | list[int] = 3,
        embedding_num_cores: int = 4,
        init: str = "random",
        layer_config: dict[str, dict[str, Any]] | None = None,
        min_compression: float = 2.0,
        log_bond_ranks: bool = True,
        check_finite_loss: bool = True,
        allow_manual_optimization: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(max_rank, int):
            _check_count("max_rank", max_rank)
        _check_count("early_epochs", early_epochs, 0)
        _check_count("early_steps", early_steps, 0)
        _check_count("late_epochs", late_epochs)
        _check_count("late_steps", late_steps)
        _check_count("prune_every_n_epochs", prune_every_n_epochs)
        _check_count("prune_every_n_steps", prune_every_n_steps)
        for a, b in (("early_epochs", "early_steps"), ("late_epochs", "late_steps"), ("prune_every_n_epochs", "prune_every_n_steps")):
            if locals()[a] is not None and locals()[b] is not None:
                raise ValueError(f"{a}={locals()[a]} and {b}={locals()[b]} conflict: set one of them (or neither).")
        _check_number("target_ratio", target_ratio, 0.0, 1.0, low_open=True)
        _check_number("rank_weight", rank_weight, 0.0)
        _check_number("gate_threshold", gate_threshold, 0.0, 0.999)
        _check_number("loss_weight", loss_weight, 0.0)
        _check_number("size_weight", size_weight, 0.0)
        _check_number("min_compression", min_compression, 0.0)
        if loss_target is not None:
            _check_number("loss_target", loss_target, 0.0)
        if size_surrogate not in ("mean", "size"):
            raise ValueError(f"size_surrogate={size_surrogate!r} is unknown; choose 'mean' or 'size'.")
        if init not in INIT_CHOICES:
            raise ValueError(f"init={init!r} is unknown; choose one of {INIT_CHOICES}.")
        _validate_layer_config(layer_config or {})

        self.tensorize_kwargs: dict[str, Any] = dict(
            target_modules=target_modules, exclude_modules=exclude_modules, max_rank=max_rank,
            embedding_max_rank=embedding_max_rank, num_cores=num_cores, embedding_num_cores=embedding_num_cores,
            init=init, layer_config=layer_config, min_compression=min_compression, gate_threshold=gate_threshold,
        )
        self.early_epochs, self.early_steps = early_epochs, early_steps
        self.late_epochs, self.late_steps = late_epochs, late_steps
        self.target_ratio, self.rank_weight = float(target_ratio), float(rank_weight)
        self.loss_target, self.loss_target_metric = loss_target, loss_target_metric
        self.loss_weight, self.size_weight = float(loss_weight), float(size_weight)
        if prune_every_n_epochs is None and prune_every_n_steps is None:
            prune_every_n_epochs = 1  # the default interval, unless a step interval is asked for
        self.prune_every_n_epochs, self.prune_every_n_steps = prune_every_n_epochs, prune_every_n_steps
        self.size_surrogate_kind = size_surrogate
        self.log_bond_ranks, self.check_finite_loss = log_bond_ranks, check_finite_loss
        self.allow_manual_optimization = allow_manual_optimization

        # Progress: checkpointed through state_dict so a resumed run continues exactly.
        self.stage = "early"
        self.size_at_switch: float | None = None
        self.size_target: float | None = None
        self.loss_target_value: float | None = None
        self.gate_normalizer: float | None = None
        self.late_start_epoch: int | None = None
        self.late_start_step: int | None = None
        self.last_prune_step = -1
        self.prune_events = 0

        self._layers: list = []
        self._trainer: pl.Trainer | None = None
        self._last: dict[str, torch.Tensor] = {}
        self._epoch_loss_sum: torch.Tensor | None = None
        self._epoch_loss_count = 0

    # ------------------------------------------------------------------ setup / teardown
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Tensorize the module (once), check the run is supported, install the objective."""
        self._trainer = trainer
        name = type(trainer.strategy).__name__
        if name in UNSUPPORTED_STRATEGIES:
            raise ValueError(
                f"ComeraCallback does not support {name} yet: pruning changes parameter shapes, which sharded "
                "strategies cannot follow. Use a single device, 'ddp' (also 'ddp_spawn'), or "
                "comera_lightning.strategy.CUDAGraphStrategy."
            )
        if not pl_module.automatic_optimization and not self.allow_manual_optimization:
            raise ValueError(
                f"{type(pl_module).__name__} uses manual optimization, where ComeraCallback cannot add the rank "
                "objective for you. Pass allow_manual_optimization=True and call `loss = callback.objective(loss)` "
                "before `self.manual_backward(loss)`."
            )
        report = tensorize(pl_module, **self.tensorize_kwargs)
        if report.swapped:
            rank_zero_info(str(report))
        self._layers = [m for _, m in tt_layers(pl_module)]
        if self.gate_normalizer is None:
            self.gate_normalizer = surrogate_normalizer(self._layers, self.size_surrogate_kind)
        install_checkpoint_loading(type(pl_module))
        if stage == "fit":
            self._resolve_schedule(trainer)
            if pl_module.automatic_optimization:
                self._wrap_training_step(pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give the module its own ``training_step`` back."""
        original = pl_module.__dict__.pop("_comera_original_training_step", None)
        if original is not None:
            pl_module.__dict__.pop("training_step", None)

    def _resolve_schedule(self, trainer: pl.Trainer) -> None:
        if self.early_epochs is None and self.early_steps is None:
            if trainer.max_epochs is None or trainer.max_epochs < 1:
                raise ValueError("ComeraCallback needs early_epochs or early_steps when the Trainer has no max_epochs.")
            self.early_epochs = max(1, round(2 * trainer.max_epochs / 3))
            rank_zero_info(f"ComeraCallback: early stage = {self.early_epochs} of {trainer.max_epochs} epochs (2/3, the paper's 20 of 30).")
        if self.early_epochs is not None and trainer.max_epochs is not None and 0 < trainer.max_epochs <= self.early_epochs:
            rank_zero_warn(
                f"early_epochs={self.early_epochs} >= max_epochs={trainer.max_epochs}: the late (compression) stage will not start."
            )

    def _wrap_training_step(self, pl_module: pl.LightningModule) -> None:
        original = pl_module.__dict__.get("_comera_original_training_step") or pl_module.training_step

        @functools.wraps(original)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            return self._apply_objective(original(*args, **kwargs))

        pl_module.__dict__["_comera_original_training_step"] = original
        pl_module.training_step = training_step

    # ------------------------------------------------------------------ objective
    def _apply_objective(self, output: Any) -> Any:
        if output is None:
            return None
        if isinstance(output, torch.Tensor):
            return self.objective(output)
        if isinstance(output, Mapping) and "loss" in output:
            return {**output, "loss": self.objective(output["loss"]), "task_loss": output["loss"].detach()}
        raise TypeError(
            f"training_step returned {type(output).__name__}; ComeraCallback needs a loss tensor or a dict with a 'loss' key."
        )

    def objective(self, task_loss: torch.Tensor) -> torch.Tensor:
        """The stage's training objective for a task loss ``L`` (METHOD §2)."""
        if self.check_finite_loss and not _capturing() and not bool(torch.isfinite(task_loss.detach()).all()):
            self._raise_non_finite(task_loss)
        surrogate = size_surrogate(self._layers, self.size_surrogate_kind, self.gate_normalizer)
        loss = task_loss.detach().float()
        self._last = {"task_loss": loss, "size_surrogate": surrogate.detach()}
        if self._epoch_loss_sum is None:  # called outside a training epoch
            self._reset_epoch_loss(loss.device)
        self._epoch_loss_sum.add_(loss)  # in place: a replayed CUDA graph keeps adding into the same tensors
        self._epoch_loss_count.add_(1)
        if self.stage == "early":
            return task_loss + self.rank_weight * surrogate
        if self.stage == "final":
            return task_loss
        size = active_size(self._layers)
        size = size.clamp_min(1.0)  # a model pruned to nothing must not divide by zero
        lam = ((loss - self.loss_target_value) / loss < (size - self.size_target) / size).to(loss.dtype)
        self._last.update(lam=lam, active_size=size)
        return self.loss_weight * task_loss + self.size_weight * surrogate + lam * surrogate + (1 - lam) * task_loss

    def _raise_non_finite(self, task_loss: torch.Tensor) -> None:
        trainer = self._trainer
        where = f"global step {trainer.global_step}, epoch {trainer.current_epoch}" if trainer else "this step"
        raise FloatingPointError(
            f"ComeraCallback: the training loss is {task_loss.detach().float().flatten()[0].item()} at {where}. "
            "Training stopped before this step's backward, so weights and saved checkpoints are not affected. "
            "Lower the learning rate, enable gradient clipping, or check the data/inputs of this batch."
        )

    # ------------------------------------------------------------------ schedule events
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Step-based stage switches and pruning, then the compression curves."""
        step = trainer.global_step
        if step != self.last_prune_step:
            if self.stage == "early" and self.early_steps is not None and step >= self.early_steps:
                self._switch_to_late(trainer, pl_module)
            elif self.stage == "late" and self.late_steps is not None and step - self.late_start_step >= self.late_steps:
                self._finish_late(trainer, pl_module)
            elif self.stage == "late" and self.prune_every_n_steps and (step - self.late_start_step) % self.prune_every_n_steps == 0:
                self._prune(trainer, pl_module, "interval")
        self._log_curves(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation at the step of a step-based switch ran after it: take L₀ from it, as an epoch-based switch would."""
        refreshable = self.loss_target is None and self.loss_target_metric != TRAIN_LOSS_TARGET
        if refreshable and self.stage == "late" and self.late_start_step == trainer.global_step and not trainer.sanity_checking:
            self.loss_target_value = self._resolve_loss_target(trainer)
            rank_zero_info(f"ComeraCallback: L₀={self.loss_target_value:.4f} from the validation at the stage switch.")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start a fresh per-epoch training-loss mean (the fallback loss target)."""
        self._reset_epoch_loss(pl_module.device)

    def _reset_epoch_loss(self, device: torch.device) -> None:
        """Zero the epoch's loss sum and step count, in place when they exist (a captured CUDA graph adds into them)."""
        if isinstance(self._epoch_loss_count, torch.Tensor) and self._epoch_loss_count.device == device:
            self._epoch_loss_sum.zero_()
            self._epoch_loss_count.zero_()
        else:
            self._epoch_loss_sum, self._epoch_loss_count = torch.zeros((), device=device), torch.zeros((), device=device)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Epoch-based stage switches and pruning (validation of this epoch has already run)."""
        done = trainer.current_epoch + 1
        if self.stage == "early" and self.early_epochs is not None and done >= self.early_epochs:
            self._switch_to_late(trainer, pl_module)
        elif self.stage == "late" and self.late_epochs is not None and done - self.late_start_epoch >= self.late_epochs:
            self._finish_late(trainer, pl_module)
        elif self.stage == "late" and self.prune_every_n_epochs and (done - self.late_start_epoch) % self.prune_every_n_epochs == 0:
            self._prune(trainer, pl_module, "interval")
        self._log_rank_table(trainer)

    def _switch_to_late(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.size_at_switch = float(active_size(self._layers))
        self.size_target = self.target_ratio * self.size_at_switch
        self.loss_target_value = self._resolve_loss_target(trainer)
        self.stage = "late"
        self.late_start_epoch, self.late_start_step = trainer.current_epoch + 1, trainer.global_step
        rank_zero_info(
            f"ComeraCallback: late stage from step {trainer.global_step}: S={self.size_at_switch:,.0f} → target "
            f"S₀={self.size_target:,.0f} (ratio {self.target_ratio}), L₀={self.loss_target_value:.4f}."
        )
        self._prune(trainer, pl_module, "stage switch")

    def _finish_late(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._prune(trainer, pl_module, "end of late stage")
        self.stage = "final"
        rank_zero_info(f"ComeraCallback: late stage done at step {trainer.global_step}; training on the task loss only.")

    def _resolve_loss_target(self, trainer: pl.Trainer) -> float:
        if self.loss_target is not None:
            return float(self.loss_target)
        metrics = trainer.callback_metrics
        if self.loss_target_metric == TRAIN_LOSS_TARGET:
            if not self._epoch_loss_count:
                raise ValueError(f"loss_target_metric={TRAIN_LOSS_TARGET!r}: no training step ran in the early stage's last epoch.")
            return float(self._epoch_loss_sum / self._epoch_loss_count)
        if self.loss_target_metric is not None:
            if self.loss_target_metric not in metrics:
                raise ValueError(
                    f"loss_target_metric={self.loss_target_metric!r} was not logged by the end of the early stage; "
                    f"logged metrics: {sorted(metrics)}."
                )
            return float(metrics[self.loss_target_metric])
        for key in AUTO_LOSS_METRICS:
            if key in metrics:
                return float(metrics[key])
        if self._epoch_loss_sum is not None and self._epoch_loss_count:
            return float(self._epoch_loss_sum / self._epoch_loss_count)
        raise ValueError("ComeraCallback could not pick a loss target: set loss_target or log a validation loss ('val/loss').")

    def _prune(self, trainer: pl.Trainer, pl_module: pl.LightningModule, reason: str) -> None:
        summary = prune_(pl_module, trainer.optimizers)
        self.last_prune_step = trainer.global_step
        self.prune_events += 1
        if summary.removed:
            self._rewrap_ddp(trainer)
        notify = getattr(trainer.strategy, "on_parameters_resized", None)
        if callable(notify):
            notify()
        rank_zero_info(
            f"ComeraCallback: prune ({reason}) at step {trainer.global_step}: "
            f"{summary.parameters_before:,} → {summary.parameters_after:,} parameters."
        )

    @staticmethod
    def _rewrap_ddp(trainer: pl.Trainer) -> None:
        """DDP's reducer buckets are sized for the old shapes: wrap the module again."""
        from torch.nn.parallel import DistributedDataParallel

        strategy = trainer.strategy
        if isinstance(strategy.model, DistributedDataParallel) and hasattr(strategy, "_setup_model"):
            strategy.model = strategy._setup_model(strategy.model.module)

    # ------------------------------------------------------------------ logging
    def _log_curves(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not getattr(trainer._logger_connector, "should_update_logs", True):
            return
        stats = compression_stats(pl_module)
        metrics: dict[str, Any] = {
            "comera/compression_model": stats.model_compression,
            "comera/compression_tt": stats.tt_compression,
            "comera/params_model": float(stats.model_parameters),
            "comera/params_tt": float(stats.tt_parameters),
            "comera/stage": float(STAGES.index(self.stage)),
        }
        size = self._last.get("active_size")
        size = active_size(self._layers) if size is None else size
        metrics["comera/params_tt_active"] = size
        metrics["comera/compression_tt_active"] = stats.dense_tt_parameters / size.clamp_min(1)
        for key in ("size_surrogate", "lam", "task_loss"):
            if key in self._last:
                metrics[f"comera/{key}"] = self._last[key]
        if self.log_bond_ranks:
            for name, layer in tt_layers(pl_module):
                for k, mask in enumerate(layer.gate_masks()):
                    metrics[f"comera/rank/{name}/{k}"] = mask.sum().float()
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def _log_rank_table(self, trainer: pl.Trainer) -> None:
        from lightning.pytorch.loggers import WandbLogger

        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not loggers or trainer.lightning_module is None:
            return
        rows = [
            [name, str(list(layer.ranks)), layer.num_parameters(), layer.dense_parameters(), round(layer.compression_ratio(), 2)]
            for name, layer in tt_layers(trainer.lightning_module)
        ]
        for lg in loggers:
            lg.log_table(key="comera/ranks", columns=["layer", "ranks", "params", "dense_params", "compression"], data=rows)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Record how the model was tensorized so ``Model.load_from_checkpoint`` can rebuild it."""
        checkpoint["comera"] = {"tensorize": dict(self.tensorize_kwargs)}

    def state_dict(self) -> dict[str, Any]:
        """Stage, targets and counters (the model's ranks travel in its own state_dict)."""
        keys = (
            "stage", "size_at_switch", "size_target", "loss_target_value", "gate_normalizer",
            "late_start_epoch", "late_start_step", "last_prune_step", "prune_events", "early_epochs",
        )
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        for key, value in state_dict.items():
            setattr(self, key, value)
