"""What ComeraCallback needs from the Trainer and its strategy: supported setups, DDP re-wraps, one value over ranks, logging steps."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from comera_lightning.checkpoint.io import AtomicCheckpointIO
from comera_lightning.data.resumable import record_consumed_batches

__all__ = ["UNSUPPORTED_STRATEGIES", "annotate_checkpoint", "check_supported", "logs_this_step", "mean_over_ranks", "rewrap_ddp", "syncs_forbidden", "use_atomic_checkpoints"]

UNSUPPORTED_STRATEGIES = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy", "XLAStrategy", "SingleDeviceXLAStrategy")


def check_supported(trainer: pl.Trainer, pl_module: pl.LightningModule, allow_manual_optimization: bool) -> None:
    """Refuse sharded strategies and (unless allowed) manual optimization, saying what to use instead."""
    name = type(trainer.strategy).__name__
    if name in UNSUPPORTED_STRATEGIES:
        raise ValueError(
            f"ComeraCallback does not support {name}: pruning changes parameter shapes, which sharded "
            "strategies cannot follow, and after tensorization parameters and optimizer state are under 1% of a "
            "process's memory, so sharding them saves little (measured in docs/SCALING.md). Use a single device, "
            "'ddp' (also 'ddp_spawn'), comera_lightning.strategy.CUDAGraphStrategy, or 'torchrec_dmp' to shard "
            "a DLRM's dense embedding tables."
        )
    if not pl_module.automatic_optimization and not allow_manual_optimization:
        raise ValueError(
            f"{type(pl_module).__name__} uses manual optimization, where ComeraCallback cannot add the rank "
            "objective for you. Pass allow_manual_optimization=True and call `loss = callback.objective(loss)` "
            "before `self.manual_backward(loss)`."
        )


def use_atomic_checkpoints(trainer: pl.Trainer) -> None:
    """Swap Lightning's default checkpoint writer for one that never leaves a truncated file (a custom one is kept)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()


def mean_over_ranks(trainer: pl.Trainer, value: float) -> float:
    """``value`` averaged over the processes (an unsynchronised validation loss differs by rank): one L₀ everywhere."""
    if trainer.world_size == 1:
        return value
    device = trainer.strategy.root_device
    return float(trainer.strategy.reduce(torch.tensor(value, dtype=torch.float64, device=device), reduce_op="mean"))


def syncs_forbidden() -> bool:
    """True while torch.compile traces or a CUDA graph is captured, where a host sync (the finite-loss check) is not allowed."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def rewrap_ddp(trainer: pl.Trainer) -> None:
    """DDP's reducer buckets are sized for the old shapes: wrap the module again."""
    from torch.nn.parallel import DistributedDataParallel

    strategy = trainer.strategy
    if isinstance(strategy.model, DistributedDataParallel) and hasattr(strategy, "_setup_model"):
        strategy.model = strategy._setup_model(strategy.model.module)


def logs_this_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning sends this training step's logged values to the loggers (``Trainer(log_every_n_steps=...)``).

    Lightning has no public way to ask: its own ``LearningRateMonitor`` and ``DeviceStatsMonitor`` read the
    logger connector's ``should_update_logs`` too (it counts optimizer-stepping batches, so gradient
    accumulation follows). A Lightning without it: every step.
    """
    return getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", True)


def annotate_checkpoint(checkpoint: dict[str, Any], trainer: pl.Trainer, tensorize_config: Any) -> None:
    """Record in ``checkpoint`` how the model was tensorized; tell resumable loaders how many batches this epoch consumed."""
    checkpoint["comera"] = {"tensorize": tensorize_config.to_dict()}
    loader_states = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader", [])
    record_consumed_batches(loader_states, trainer.fit_loop.epoch_loop.batch_progress.current.ready)
