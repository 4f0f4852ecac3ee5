"""The capture machinery behind CUDAGraphStrategy: plain code, no Lightning strategy.

Batch keys and bucket padding (:func:`batch_key`, :func:`pad_to_bucket`), one captured step
(:class:`StepGraph`), deferred logging while capturing (:func:`deferring`) and capturable
optimizers (:func:`make_capturable_`). Which keys warm up, get captured or replay is
:class:`~comera_lightning.strategy.graph_cache.GraphCache` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn
from torchmetrics import Metric

from comera_lightning.strategy.graph_cache import CAPTURE, EAGER, REPLAY, WARMUP, GraphCache

__all__ = [
    "CAPTURE", "EAGER", "REPLAY", "WARMUP", "DeferredCall", "GraphCache", "StepGraph", "UncapturableBatch",
    "batch_key", "check_bucket_options", "deferring", "end_failed_capture_rng", "make_capturable_", "pad_to_bucket",
    "skip_argument_checks",
]

_MISSING = object()


class UncapturableBatch(ValueError):
    """A training batch that cannot go into a CUDA graph's static buffers; the message says why."""


# ---------------------------------------------------------------------------------------- batches
def _leaves(batch: Any, path: tuple = ()) -> Iterator[tuple[tuple, Tensor | None]]:
    if batch is None or isinstance(batch, Tensor):
        yield path, batch
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(batch, (list, tuple)):
        for i, value in enumerate(batch):
            yield from _leaves(value, (*path, i))
    else:
        where = "the batch" if not path else f"batch{''.join(f'[{p!r}]' for p in path)}"
        raise UncapturableBatch(
            f"{where} is a {type(batch).__name__}: a CUDA graph needs batches of tensors (or dicts/lists/tuples "
            "of them) whose shapes repeat; jagged inputs such as TorchRec's KeyedJaggedTensor change shape every batch"
        )


def batch_key(batch: Any) -> tuple:
    """The graph key of a batch: where each tensor sits, its shape, dtype and device (raises :class:`UncapturableBatch`)."""
    return tuple(
        (path, None) if t is None else (path, tuple(t.shape), t.dtype, str(t.device)) for path, t in _leaves(batch)
    )


def check_bucket_options(buckets: Sequence[int] | None, pad_values: Mapping[str, float] | None) -> None:
    """Raise a ValueError naming the fix for ``buckets``/``pad_values`` that do not go together."""
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


def pad_to_bucket(batch: Any, buckets: Sequence[int], pad_values: Mapping[str, float]) -> Any:
    """Pad dim 1 (the sequence) of the ``pad_values`` keys of a dict batch up to the smallest bucket that holds it.

    Keys of ``pad_values`` the batch lacks are ignored; a batch without any of them is returned as it is.
    Raises :class:`UncapturableBatch` for a batch that is not a dict, keys that disagree on the length,
    or a length above the largest bucket.
    """
    if not isinstance(batch, Mapping):
        raise UncapturableBatch(f"buckets pad dict batches by key, got a batch of type {type(batch).__name__}")
    keys = [k for k in pad_values if k in batch]
    lengths = {k: batch[k].shape[1] for k in keys}
    if len(set(lengths.values())) > 1:
        raise UncapturableBatch(f"the keys to pad disagree on the sequence length (dim 1): {lengths}")
    if not keys:
        return batch
    length = next(iter(lengths.values()))
    target = next((b for b in sorted(buckets) if b >= length), None)
    if target is None:
        raise UncapturableBatch(f"a batch of sequence length {length} is longer than the largest bucket ({max(buckets)})")
    if target == length:
        return batch
    padded = dict(batch)
    for k in keys:
        t = batch[k]
        padded[k] = torch.nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, target - length], value=pad_values[k])
    return padded


# ---------------------------------------------------------------------------------------- one step
class StepGraph:
    """One captured training step for one batch key: static batch tensors, the graph, and what the step returned.

    ``deferred`` holds the calls recorded during capture (``log`` in the step and its hooks, metric
    updates) that :meth:`reissue` runs again after every replay.
    """

    def __init__(self, batch: Any) -> None:
        self.static_batch = apply_to_collection(batch, Tensor, torch.clone)
        self._static = [t for _, t in _leaves(self.static_batch) if t is not None]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.deferred: list[DeferredCall] = []
        self.grads: list[tuple[nn.Parameter, Tensor | None]] = []
        self.replays = 0

    def load(self, batch: Any) -> None:
        """Copy ``batch`` (same key) into the static tensors, without a host sync."""
        for dst, src in zip(self._static, (t for _, t in _leaves(batch) if t is not None)):
            dst.copy_(src, non_blocking=True)

    def capture(self, step: Callable[[], Any], pool: Any = None) -> Any:
        """Capture ``step()`` (which must read the batch from ``static_batch``) into memory ``pool``; returns what it returned."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: a DataLoader pin-memory thread may call CUDA while we capture
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            result = step()
        self.graph = graph
        return result

    def replay(self) -> None:
        """Run the captured step on the batch last loaded."""
        self.graph.replay()
        self.replays += 1

    def reissue(self) -> Any:
        """Run the deferred calls again and return a copy of the step's outputs (the next replay overwrites them)."""
        for call in self.deferred:
            call.run()
        return apply_to_collection(self.outputs, Tensor, lambda t: t.detach().clone())


class DeferredCall(NamedTuple):
    """A ``log`` or metric call recorded while capturing, with the Lightning hook it was made in."""

    fn: Callable
    args: tuple
    kwargs: dict
    hook: str | None

    def run(self) -> None:
        """Make the call again, as from the hook it was recorded in (Lightning checks and keys ``log`` by hook)."""
        owner = getattr(self.fn, "__self__", None)
        if not hasattr(owner, "_current_fx_name"):
            self.fn(*self.args, **self.kwargs)
            return
        current, owner._current_fx_name = owner._current_fx_name, self.hook
        try:
            self.fn(*self.args, **self.kwargs)
        finally:
            owner._current_fx_name = current


def end_failed_capture_rng(device: torch.device) -> None:
    """Take the device's default generator out of capture mode after a capture that failed.

    A capture that CUDA invalidated (a host sync inside it, say) ends without the generator's epilogue, and
    the next random op outside a graph (dropout in the eager steps that follow) raises "Offset increment
    outside graph capture encountered unexpectedly" (seen on an H200). An empty capture runs the prologue
    and epilogue again; the generator's seed and offset are those from before the failed capture.
    """
    if device.type != "cuda":
        return
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.empty(1, device=device).zero_()  # one kernel: an empty graph draws a warning


@contextmanager
def deferring(module: nn.Module) -> Iterator[list[DeferredCall]]:
    """Record instead of running ``module.log`` and the ``forward``/``update`` calls of its torchmetrics metrics."""
    calls: list[DeferredCall] = []
    targets = [(module, "log")] + [(m, name) for m in module.modules() if isinstance(m, Metric) for name in ("forward", "update")]
    saved = []
    for obj, name in targets:
        saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
        original = getattr(obj, name)
        obj.__dict__[name] = lambda *args, _fn=original, **kwargs: calls.append(
            DeferredCall(_fn, args, kwargs, getattr(module, "_current_fx_name", None))
        )
    try:
        yield calls
    finally:
        for obj, name, value in reversed(saved):
            if value is _MISSING:
                del obj.__dict__[name]
            else:
                obj.__dict__[name] = value


def skip_argument_checks(module: nn.Module) -> list[Metric]:
    """Turn off ``validate_args`` (a host sync: ``torch.unique``) of ``module``'s metrics; returns those changed.

    Replays re-issue the metric calls of the captured step; the eager steps before it checked them.
    """
    changed = [m for m in module.modules() if isinstance(m, Metric) and getattr(m, "validate_args", False)]
    for metric in changed:
        metric.validate_args = False
    return changed


def make_capturable_(optimizer: torch.optim.Optimizer) -> dict[int, Tensor]:
    """Let ``optimizer.step()`` run inside a CUDA graph, in place; returns the learning-rate tensors by group index.

    Sets ``capturable=True``, moves ``step`` counts to their parameter's device and turns each
    group's ``lr`` into a 0-dim float32 tensor there (LR schedulers then ``fill_`` it in place).
    The optimizer must have a ``capturable`` option (torch's Adam/AdamW, CAME, ...).
    """
    if "capturable" not in optimizer.defaults:
        raise ValueError(f"{type(optimizer).__name__} has no 'capturable' option; its step() cannot be captured.")
    optimizer.defaults["capturable"] = True
    lrs = {}
    for i, group in enumerate(optimizer.param_groups):
        group["capturable"] = True
        if group["params"]:
            device = group["params"][0].device
            lr = group["lr"]
            lr = lr.to(device=device, dtype=torch.float32) if isinstance(lr, Tensor) else torch.tensor(float(lr), device=device)
            group["lr"] = lrs[i] = lr
    for param, state in optimizer.state.items():
        step = state.get("step")
        if isinstance(step, Tensor) and step.device != param.device:
            state["step"] = step.to(device=param.device, dtype=torch.float32)
    return lrs
