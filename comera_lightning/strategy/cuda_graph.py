"""CUDAGraphStrategy: a one-device Lightning strategy that replays the whole training step as a CUDA graph.

Tensorized training launches many small kernels, and the CoMERA paper captures the whole step
in a CUDA graph to remove their launch overhead (docs/METHOD.md §3, last row). On CUDA, with
automatic optimization, a training step runs like this (the machinery is in
:mod:`comera_lightning.strategy.capture`):

1. ``batch_to_device``: the batch moves to the GPU, is padded up to a length bucket when
   ``buckets`` is set, and gets its *key*: the structure, shapes and dtypes of its tensors.
2. ``optimizer_step``: for each key, the first ``warmup_steps`` steps run eagerly on a side
   stream. The next one is captured: Lightning's own closure (``training_step`` with
   ``ComeraCallback``'s objective, ``zero_grad``, ``backward``, the ``on_before_optimizer_step``
   hooks, gradient clipping) and ``optimizer.step()`` all run under ``torch.cuda.graph`` on
   static copies of the batch tensors. Every later step with that key copies its batch into
   those copies and replays the graph: one launch for the whole step.
3. Inside the captured ``training_step``, ``self.log`` and the calls of the module's torchmetrics
   metrics are recorded instead of run, and re-issued after every replay with the step's device
   tensors: logged values stay on the device and nothing in the step waits for the host.
4. Rank pruning swaps in smaller parameters: ``ComeraCallback`` calls
   :meth:`CUDAGraphStrategy.on_parameters_resized` after every prune, the stage switch and the
   end of the late stage included, and every graph is dropped; the next steps warm up and
   capture again at the new shapes (the new stage's objective included). Validation runs eagerly.

The optimizer is made capturable when training starts (``capturable=True``, its ``step`` counts
and learning rates moved to the device as tensors that LR schedulers update in place), which
torch's Adam/AdamW and :class:`~comera_lightning.optim.CAME` support. Where graphs cannot apply,
the strategy says why once and runs those steps eagerly, exactly as ``SingleDeviceStrategy``:

* no CUDA device (or ``cuda_graphs=False``);
* manual optimization, ``accumulate_grad_batches > 1``, ``16-mixed`` precision (its GradScaler
  reads on the host whether to skip the step);
* an optimizer without a ``capturable`` option (e.g. SGD, Adagrad);
* batches that are not tensors, or dicts/lists/tuples of them (TorchRec's ``KeyedJaggedTensor``
  is jagged: the DLRM steps run eagerly), batches longer than the largest bucket, more distinct
  batch shapes than ``max_graphs``;
* a training step that cannot be captured (a host sync such as ``.item()`` or boolean-mask
  indexing, e.g. ``MaskedLanguageModel(head_on_masked_only=True)``): graphs are then off for the run.

Limits of the captured step: Python in ``training_step`` runs only at capture (values it reads
from the host are frozen then, e.g. ``batch_idx`` or ``self.global_step``); the hooks inside the
step (``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``) act only at
capture, their tensor work is replayed; a metric's return value is not available inside the
step (log the metric object); optimizer hyper-parameters other than ``lr`` are frozen at capture;
``ComeraCallback``'s per-step finite-loss check (a host sync) is skipped while capturing.

On CPU the strategy runs eagerly (the default strategy's code path). The former CPU
``torch.compile`` path was removed (1.32× slower than eager, 72 s first step); ``compile=True``
only warns.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from comera_lightning.strategy.capture import (
    CAPTURE,
    EAGER,
    REPLAY,
    WARMUP,
    GraphCache,
    StepGraph,
    UncapturableBatch,
    batch_key,
    deferring,
    make_capturable_,
    pad_to_bucket,
)

__all__ = ["COMPILE_REMOVED", "CUDAGraphStrategy"]

COMPILE_REMOVED = (
    "CUDAGraphStrategy(compile=True) is deprecated and does nothing: the CPU torch.compile path was removed "
    "because it measured 1.32× slower than eager with a 72 s first step; training runs eagerly on CPU."
)


class CUDAGraphStrategy(SingleDeviceStrategy):
    """One-device strategy that captures the whole training step in a CUDA graph and re-captures after each prune.

    Args:
        device: the device; default ``cuda:0`` when the Trainer's accelerator is CUDA, else ``cpu``.
        cuda_graphs: capture on CUDA (``False``: eager, like ``SingleDeviceStrategy``).
        warmup_steps: eager steps per batch shape before its capture (also after every re-capture request).
        max_graphs: most graphs kept at once (one per batch shape); other shapes run eagerly.
        buckets: sequence lengths to pad training batches up to (one graph each); needs ``pad_values``.
        pad_values: dict-batch keys to pad along dim 1 and their pad value, e.g.
            ``{input_ids: 0, attention_mask: 0, token_type_ids: 0}`` (labels of a masked LM: -100).
        compile: deprecated no-op; ``True`` warns (the CPU ``torch.compile`` path was removed).
        accelerator, checkpoint_io, precision_plugin: as for ``SingleDeviceStrategy``.
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
        compile: bool = False,
    ) -> None:
        if compile:
            warnings.warn(COMPILE_REMOVED, DeprecationWarning, stacklevel=2)
        for name, value in (("warmup_steps", warmup_steps), ("max_graphs", max_graphs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if buckets is not None:
            if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
                raise ValueError(f"buckets must be a non-empty list of positive sequence lengths, got {buckets!r}.")
            if not pad_values:
                raise ValueError(
                    "buckets need pad_values naming the batch keys to pad and their pad value, "
                    "e.g. {input_ids: 0, attention_mask: 0, token_type_ids: 0}."
                )
        elif pad_values:
            raise ValueError(f"pad_values={pad_values!r} is only used with buckets; set buckets (e.g. [64, 128]) too.")
        super().__init__(
            device=device if device is not None else "cpu",
            accelerator=accelerator, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin,
        )
        self._device_given = device is not None
        self.cuda_graphs = cuda_graphs
        self.buckets = sorted(set(buckets)) if buckets else None
        self.pad_values = dict(pad_values or {})
        self.graph_cache = GraphCache(warmup_steps, max_graphs)
        self.refusal: str | None = "training has not started"  # why steps run eagerly (None: graphs on)
        self._said: set[str] = set()
        self._mode: str | None = None  # CAPTURE / REPLAY while optimizer_step runs Lightning's closure
        self._entry: StepGraph | None = None
        self._step_batch: Any = None
        self._step_key: tuple | None = None
        self._step_refusal: str | None = None
        self._lrs: list[tuple[dict, Tensor]] = []
        self._side_stream: torch.cuda.Stream | None = None

    @property
    def root_device(self) -> torch.device:
        """The device given, else ``cuda:0`` under a CUDA accelerator (or with none yet and CUDA present), else CPU."""
        if self._device_given:
            return self._root_device
        from lightning.pytorch.accelerators import CUDAAccelerator

        accelerator = self._accelerator
        cuda = isinstance(accelerator, CUDAAccelerator) or (accelerator is None and torch.cuda.is_available())
        return torch.device("cuda", 0) if cuda else torch.device("cpu")

    # ------------------------------------------------------------------ when graphs apply
    def capture_refusal(self, trainer: pl.Trainer) -> str | None:
        """Why this run's training steps cannot be captured (``None``: they can)."""
        module = trainer.lightning_module
        if not self.cuda_graphs:
            return "cuda_graphs=False"
        if self.root_device.type != "cuda":
            return f"no CUDA device (training on {self.root_device.type})"
        if not module.automatic_optimization:
            return "manual optimization: only Lightning's automatic optimization step can be captured"
        if trainer.accumulate_grad_batches > 1:
            return f"accumulate_grad_batches={trainer.accumulate_grad_batches}: gradient accumulation is not captured; use 1"
        if getattr(self.precision_plugin, "scaler", None) is not None:
            return "16-mixed precision: its GradScaler reads on the host whether to skip a step; use bf16-mixed or 32-true"
        if len(self.optimizers) != 1:
            return f"{len(self.optimizers)} optimizers: one is captured"
        optimizer = self.optimizers[0]
        if "capturable" not in optimizer.defaults:
            return (
                f"{type(optimizer).__name__} has no 'capturable' option, so its step cannot run in a CUDA graph; "
                "use torch.optim.AdamW/Adam or comera_lightning.CAME"
            )
        return None

    def _say(self, message: str, *, warn: bool = True) -> None:
        """Tell the user once: a warning, or an info line for what is expected (e.g. no CUDA)."""
        if message not in self._said:
            self._said.add(message)
            rank_zero_warn(f"CUDAGraphStrategy: {message}") if warn else rank_zero_info(f"CUDAGraphStrategy: {message}")

    def _refuse(self, reason: str, *, warn: bool = True) -> None:
        self._say(f"{reason}; these training steps run eagerly.", warn=warn)

    def _graphs_on(self) -> bool:
        return self.refusal is None

    # ------------------------------------------------------------------ lifecycle
    def on_train_start(self) -> None:
        """Decide whether steps are captured; if so, make the optimizer capturable."""
        super().on_train_start()
        trainer = self.lightning_module.trainer
        self.graph_cache = GraphCache(self.graph_cache.warmup_steps, self.graph_cache.max_graphs)
        self.refusal = self.capture_refusal(trainer)
        if self.refusal is not None:
            self._refuse(self.refusal, warn=self.cuda_graphs and self.root_device.type == "cuda")
        else:
            optimizer = self.optimizers[0]
            self._lrs = [(optimizer.param_groups[i], lr) for i, lr in make_capturable_(optimizer).items()]
            self._side_stream = torch.cuda.Stream(self.root_device)

    def on_train_end(self) -> None:
        """Free the graphs."""
        super().on_train_end()
        self.graph_cache.clear()
        self._lrs, self._side_stream = [], None

    def teardown(self) -> None:
        """Free the graphs before the module leaves the device."""
        self.graph_cache.clear()
        super().teardown()

    def on_parameters_resized(self) -> None:
        """Parameters were replaced by pruned ones (ComeraCallback calls this): drop the graphs."""
        self.graph_cache.invalidate()

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
        """The module's training step; while capturing, on the static batch with side effects deferred; on replay, its outputs."""
        if self._mode == REPLAY:
            return self._entry.reissue()
        if self._mode == CAPTURE:
            with deferring(self.lightning_module) as calls:
                outputs = super().training_step(self._entry.static_batch, *args[1:], **kwargs)
            self._entry.outputs, self._entry.deferred = outputs, calls
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
        if not self._graphs_on():
            return eager()
        if batch is None:
            refusal = "the training batch did not pass through batch_to_device (a training_step taking a dataloader_iter?)"
        if refusal is not None:
            self._refuse(refusal)
            return eager()
        entry = self.graph_cache.graphs.get(key)
        if entry is not None and entry.param_ids != self._param_ids():
            self._say("parameters were replaced without on_parameters_resized(); graphs are captured anew.", warn=False)
            self.graph_cache.invalidate()
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

    def _on_side_stream(self, run: Callable[[], Any]) -> Any:
        current = torch.cuda.current_stream(self.root_device)
        self._side_stream.wait_stream(current)
        with torch.cuda.stream(self._side_stream):
            result = run()
        current.wait_stream(self._side_stream)
        return result

    def _param_ids(self) -> tuple[int, ...]:
        return tuple(map(id, self.lightning_module.parameters()))

    def _capture(self, key: tuple, batch: Any, optimizer: torch.optim.Optimizer, eager: Callable[[], Any]) -> StepGraph | None:
        entry = StepGraph(batch)
        optimizer.zero_grad(set_to_none=True)  # backward then allocates the gradients from the graph's pool
        stream = torch.cuda.current_stream(self.root_device)
        self._mode, self._entry = CAPTURE, entry
        try:
            entry.capture(eager)
        except Exception as err:  # any failure: say why, stay eager for the rest of the run
            torch.cuda.set_stream(stream)
            optimizer.zero_grad(set_to_none=True)
            self.refusal = f"capturing the training step failed ({type(err).__name__}: {err})"
            self._refuse(self.refusal)
            return None
        finally:
            self._mode = self._entry = None
        params = list(self.lightning_module.parameters())
        entry.grads = [(p, p.grad) for p in params]
        entry.param_ids = tuple(map(id, params))
        self.graph_cache.store(key, entry)
        return entry

    def _replay(self, entry: StepGraph, closure: Callable[[], Any]) -> Any:
        for group, lr in self._lrs:  # a learning rate set as a float (not through fill_) goes into the graph's tensor
            if group["lr"] is not lr:
                lr.copy_(group["lr"]) if isinstance(group["lr"], Tensor) else lr.fill_(float(group["lr"]))
                group["lr"] = lr
        entry.replay()
        self._mode, self._entry = REPLAY, entry
        try:
            loss = closure()  # Lightning's bookkeeping: training_step re-logs and returns the outputs, no backward
        finally:
            self._mode = self._entry = None
        for param, grad in entry.grads:  # the closure's zero_grad dropped them; the graph wrote this step's
            param.grad = grad
        return loss
