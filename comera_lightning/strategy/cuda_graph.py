"""CUDAGraphStrategy: a one-device Lightning strategy that replays the whole training step as a CUDA graph.

Tensorized training launches many small kernels; the CoMERA paper captures the whole step in a
CUDA graph to remove their launch overhead (docs/METHOD.md §3). On CUDA, with automatic
optimization, each batch key (structure, shapes, dtypes; padded to ``buckets`` if set) warms up
for ``warmup_steps`` eager steps, is captured once (Lightning's closure: ``training_step`` with
``ComeraCallback``'s objective, ``zero_grad``, ``backward``, the hooks, clipping, and
``optimizer.step()``) and replayed after that. docs/CUDA_GRAPHS.md says what is frozen at
capture and what is re-captured, checked or refused, and what has (not) been run on a GPU.
Where graphs cannot apply the strategy says why once and runs those steps eagerly, exactly as
``SingleDeviceStrategy``; on CPU it always does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torchmetrics import Metric

from comera_lightning.strategy.capture import (
    StepGraph,
    UncapturableBatch,
    batch_key,
    check_bucket_options,
    deferring,
    end_failed_capture_rng,
    pad_to_bucket,
    skip_argument_checks,
)
from comera_lightning.strategy.graph_cache import CAPTURE, EAGER, REPLAY, WARMUP, GraphCache
from comera_lightning.strategy.hyperparams import GraphedOptimizer, plain_checkpoint
from comera_lightning.strategy.protocol import GraphSignatureSource
from comera_lightning.strategy.step_checks import NonFiniteFlag, accumulation_refusal, graph_device, run_refusal

__all__ = ["CUDAGraphStrategy"]

#: Re-captures in a row, each before any replay, after which graphs are turned off for the run.
MAX_IDLE_RECAPTURES = 3


class CUDAGraphStrategy(SingleDeviceStrategy):
    """One-device strategy that captures the whole training step in a CUDA graph and re-captures after each prune.

    Args:
        device: the device; default: the Trainer's CUDA device (``devices=[1]``: ``cuda:1``; several are refused),
            else ``cpu``.
        cuda_graphs: capture on CUDA (``False``: eager, like ``SingleDeviceStrategy``).
        warmup_steps: eager steps per batch shape before its capture (also after every re-capture request).
        max_graphs: most graphs kept at once (one per batch shape); other shapes run eagerly.
        buckets: sequence lengths to pad training batches up to (one graph each); needs ``pad_values``.
        pad_values: dict-batch keys to pad along dim 1 and their pad value, e.g.
            ``{input_ids: 0, attention_mask: 0, token_type_ids: 0}`` (labels of a masked LM: -100).
        check_finite_loss: stop training when a replayed step's loss is NaN or inf (checked one step late).
        accelerator: as for ``SingleDeviceStrategy`` (and so are ``checkpoint_io`` and ``precision_plugin``).
    """

    def __init__(
        self,
        device: str | None = None,
        accelerator: pl.accelerators.Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        *,
        cuda_graphs: bool = True,
        warmup_steps: int = 3,
        max_graphs: int = 8,
        buckets: list[int] | None = None,
        pad_values: dict[str, float] | None = None,
        check_finite_loss: bool = True,
    ) -> None:
        check_bucket_options(buckets, pad_values)
        self.graph_cache = GraphCache(warmup_steps, max_graphs)  # checks both
        super().__init__(
            device=device if device is not None else "cpu",
            accelerator=accelerator, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin,
        )
        self._device_given = device is not None
        self.cuda_graphs, self.check_finite_loss = cuda_graphs, check_finite_loss
        self.buckets = sorted(set(buckets)) if buckets else None
        self.pad_values = dict(pad_values or {})
        self.refusal: str | None = "training has not started"  # why steps run eagerly (None: graphs on)
        self._said: set[str] = set()
        self._mode: str | None = None  # CAPTURE / REPLAY while optimizer_step runs Lightning's closure
        self._entry: StepGraph | None = None
        self._step_batch: Any = None
        self._step_key: tuple | None = None
        self._step_refusal: str | None = None
        self._graphed: GraphedOptimizer | None = None
        self._flag: NonFiniteFlag | None = None
        self._side_stream: torch.cuda.Stream | None = None
        self._unvalidated: list[Metric] = []  # metrics whose validate_args (a host sync) is off while graphs replay
        self._idle_recaptures = 0

    @property
    def root_device(self) -> torch.device:
        """The device given, else the Trainer's CUDA device (``cuda:0`` before there is a Trainer), else CPU."""
        if self._device_given:
            return self._root_device
        from lightning.pytorch.accelerators import CUDAAccelerator

        accelerator = self._accelerator
        cuda = isinstance(accelerator, CUDAAccelerator) or (accelerator is None and torch.cuda.is_available())
        trainer = getattr(self._lightning_module, "_trainer", None)
        requested = getattr(getattr(trainer, "_accelerator_connector", None), "_parallel_devices", None) or []
        return graph_device(cuda, requested)

    # ------------------------------------------------------------------ when graphs apply
    def capture_refusal(self, trainer: pl.Trainer) -> str | None:
        """Why this run's training steps cannot be captured (``None``: they can)."""
        if not self.cuda_graphs:
            return "cuda_graphs=False"
        if self.root_device.type != "cuda":
            return f"no CUDA device (training on {self.root_device.type})"
        return run_refusal(trainer, self.precision_plugin, self.optimizers)

    def _say(self, message: str, *, warn: bool = True) -> None:
        """Tell the user once: a warning, or an info line for what is expected (e.g. no CUDA)."""
        if message not in self._said:
            self._said.add(message)
            rank_zero_warn(f"CUDAGraphStrategy: {message}") if warn else rank_zero_info(f"CUDAGraphStrategy: {message}")

    def _refuse(self, reason: str, *, warn: bool = True) -> None:
        self._say(f"{reason}; these training steps run eagerly.", warn=warn)

    def _graphs_on(self) -> bool:
        return self.refusal is None

    def _turn_off(self, reason: str) -> None:
        """Graphs off for the rest of the run: say why, free the graphs and their memory."""
        self.refusal = reason
        self._refuse(reason)
        self._release()

    def _release(self) -> None:
        self.graph_cache.clear()
        if self.root_device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()  # the graphs' pool goes back to the device, not only to the allocator's cache

    # ------------------------------------------------------------------ lifecycle
    def on_train_start(self) -> None:
        """Decide whether steps are captured; if so, make the optimizer capturable."""
        super().on_train_start()
        trainer = self.lightning_module.trainer
        self.graph_cache = GraphCache(self.graph_cache.warmup_steps, self.graph_cache.max_graphs)
        self._idle_recaptures = 0
        self.refusal = self.capture_refusal(trainer)
        if self.refusal is not None:
            self._refuse(self.refusal, warn=self.cuda_graphs and self.root_device.type == "cuda")
            return
        self._graphed = GraphedOptimizer(self.optimizers[0])
        self._flag = NonFiniteFlag(self.root_device) if self.check_finite_loss else None
        self._side_stream = torch.cuda.Stream(self.root_device)

    def on_train_end(self) -> None:
        """Check the last replayed steps' losses, free the graphs, give the optimizer and metrics their settings back."""
        super().on_train_end()
        try:
            if self._flag is not None:
                self._flag.check(wait=True)
        finally:
            self._stop_graphs()

    def teardown(self) -> None:
        """Free the graphs before the module leaves the device."""
        self._stop_graphs()
        super().teardown()

    def _stop_graphs(self) -> None:
        self._release()
        if self._graphed is not None:
            self._graphed.restore()
        for metric in self._unvalidated:
            metric.validate_args = True
        self._graphed, self._flag, self._side_stream, self._unvalidated = None, None, None, []

    def on_parameters_resized(self) -> None:
        """Parameters may have been replaced by pruned ones (ComeraCallback calls this): re-capture if anything changed."""
        if self._graphs_on() and self._graphed is not None:
            self.graph_cache.follow(self._signature())

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` without capture settings (float LRs, the optimizer's own ``capturable``), never after a NaN step."""
        if self._flag is not None:
            self._flag.check(wait=True)  # raises for a NaN step not yet read
        if self._graphed is not None:
            checkpoint = plain_checkpoint(checkpoint, self._graphed)
        super().save_checkpoint(checkpoint, filepath, storage_options)

    # ------------------------------------------------------------------ the step
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move the batch; for a training step that is captured, pad it to its bucket and key it."""
        batch = super().batch_to_device(batch, device, dataloader_idx)
        module = self.lightning_module
        trainer = module._trainer if module is not None else None
        if trainer is None or trainer.state.stage != RunningStage.TRAINING or not self._graphs_on():
            return batch
        self._step_key = self._step_refusal = None
        try:
            if self.buckets:
                batch = pad_to_bucket(batch, self.buckets, self.pad_values)
            self._step_key = batch_key(batch)
        except UncapturableBatch as err:
            self._step_refusal = str(err)
        self._step_batch = batch
        return batch

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's training step; while capturing, on the static batch (its loss flagged if not finite); on replay, its outputs."""
        if self._mode == REPLAY:
            return self._entry.reissue()
        if self._mode == CAPTURE:
            outputs = super().training_step(self._entry.static_batch, *args[1:], **kwargs)
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, Tensor) and self._flag is not None:
                self._flag.write(loss)
            self._entry.outputs = outputs
            return outputs
        return super().training_step(*args, **kwargs)

    def backward(self, closure_loss: Tensor, optimizer: torch.optim.Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        """Backward, except on replay (the graph did it)."""
        if self._mode == REPLAY:
            return closure_loss
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """Run the step eagerly, as a warm-up on a side stream, captured then replayed, or replayed."""
        eager = functools.partial(super().optimizer_step, optimizer, closure, model, **kwargs)
        batch, key, refusal = self._step_batch, self._step_key, self._step_refusal
        self._step_batch = self._step_key = self._step_refusal = None
        trainer = self.lightning_module.trainer
        if self._graphs_on() and trainer.accumulate_grad_batches > 1:  # e.g. a GradientAccumulationScheduler
            self._turn_off(f"accumulate_grad_batches changed to {trainer.accumulate_grad_batches} during training: "
                           "gradient accumulation is not captured")
        if not self._graphs_on():
            return eager()
        self._graphed.sync()  # before warm-ups and captures too: a float LR set now must not be frozen
        if batch is None:
            refusal = "the training batch did not pass through batch_to_device (a training_step taking a dataloader_iter?)"
        if refusal is not None:
            self._refuse(refusal)
            return eager()
        self._follow_signature()
        if not self._graphs_on():
            return eager()
        plan = self.graph_cache.plan(key)
        if plan == EAGER:
            self._refuse(f"more than max_graphs={self.graph_cache.max_graphs} batch shapes; set buckets or pad in the data")
            return eager()
        if plan == WARMUP:
            self.graph_cache.warmed(key)
            return self._on_side_stream(eager)
        if plan == CAPTURE:
            entry = self._capture(key, batch, optimizer, eager)
            if entry is None:
                return eager()
        else:
            entry = self.graph_cache.graphs[key]
            entry.load(batch)
        return self._replay(entry, closure)

    def _signature(self) -> dict[str, Any]:
        """What a captured step freezes: parameters (identity, shape), hyper-parameters, the callbacks' and module's say."""
        module = self.lightning_module
        signature = {"parameters": tuple((id(p), p.shape) for p in module.parameters()), **self._graphed.frozen()}
        for i, owner in enumerate([*module.trainer.callbacks, module]):
            if isinstance(owner, GraphSignatureSource):
                signature[f"{type(owner).__name__}#{i}"] = owner.cuda_graph_signature()
        return signature

    def _follow_signature(self) -> None:
        before = self.graph_cache.invalidations
        changed = self.graph_cache.follow(self._signature())
        if self.graph_cache.invalidations == before:
            return
        self._idle_recaptures += 1
        if self._idle_recaptures >= MAX_IDLE_RECAPTURES:
            self._turn_off(
                f"what the captured step froze ({', '.join(changed)}) changed {MAX_IDLE_RECAPTURES} times in a row before any "
                "replay; a scheduler changing momentum/betas every step cannot be captured (e.g. OneCycleLR(cycle_momentum=False))"
            )

    def _on_side_stream(self, run: Callable[[], Any]) -> Any:
        current = torch.cuda.current_stream(self.root_device)
        self._side_stream.wait_stream(current)
        with torch.cuda.stream(self._side_stream):
            result = run()
        current.wait_stream(self._side_stream)
        return result

    def _capture(self, key: tuple, batch: Any, optimizer: torch.optim.Optimizer, eager: Callable[[], Any]) -> StepGraph | None:
        refusal = accumulation_refusal(self.lightning_module, optimizer)
        if refusal is not None:
            return self._turn_off(refusal)
        entry = StepGraph(batch)
        optimizer.zero_grad(set_to_none=True)  # backward then allocates the gradients from the graph's pool
        stream = torch.cuda.current_stream(self.root_device)
        if self.graph_cache.pool is None:
            self.graph_cache.pool = torch.cuda.graph_pool_handle()  # one pool for every key until the next invalidation
        self._mode, self._entry = CAPTURE, entry
        try:
            with deferring(self.lightning_module) as calls:  # log calls of the step and of its hooks
                entry.capture(eager, self.graph_cache.pool)
            entry.deferred = calls
        except Exception as err:  # any failure (an OOM included): say why, free every graph, stay eager
            torch.cuda.set_stream(stream)
            end_failed_capture_rng(self.root_device)
            optimizer.zero_grad(set_to_none=True)
            self._turn_off(f"capturing the training step failed ({type(err).__name__}: {err})")
            return None
        finally:
            self._mode = self._entry = None
        entry.grads = [(p, p.grad) for p in self.lightning_module.parameters()]
        self.graph_cache.store(key, entry)
        self._after_capture(entry)
        return entry

    def _after_capture(self, entry: StepGraph) -> None:
        self._unvalidated += skip_argument_checks(self.lightning_module)
        bar = self.lightning_module.trainer.progress_bar_callback
        if getattr(bar, "refresh_rate", 0) == 1 and any(call.kwargs.get("prog_bar") for call in entry.deferred):
            self._say("the progress bar refreshes every step and reads the prog_bar values on the host, a GPU sync per "
                      "step; use e.g. TQDMProgressBar(refresh_rate=20) to keep replayed steps free of host syncs.")

    def _replay(self, entry: StepGraph, closure: Callable[[], Any]) -> Any:
        entry.replay()
        self.graph_cache.replayed()
        self._idle_recaptures = 0
        self._mode, self._entry = REPLAY, entry
        try:
            loss = closure()  # Lightning's bookkeeping: training_step re-logs and returns the outputs, no backward
        finally:
            self._mode = self._entry = None
        for param, grad in entry.grads:  # the closure's zero_grad dropped them; the graph wrote this step's
            param.grad = grad
        if self._flag is not None:
            self._flag.arm(self.lightning_module.trainer.global_step)
            self._flag.check(wait=False)
        return loss
