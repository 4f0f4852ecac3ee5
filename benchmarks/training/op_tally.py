"""What one training step asks of a device, counted on any device (CPU included): the step account's instrument.

``OpTally`` is a ``TorchDispatchMode``: every aten op a step dispatches passes through it. Per *phase* (forward,
backward, optimizer, callback, loop) it counts kernels (non-view ops that launch one: allocations, views and host
reads launch none; a host read is counted apart as a sync), GEMM multiply-adds × 2 (torch's own FLOP formulas,
``torch.utils.flop_counter``; apart, those of GEMMs whose operands a GPU cannot read in 16-byte rows: ``rows_aligned``)
and the bytes the other ops read and write (inputs plus outputs: what a memory-bound kernel moves). ``PhaseMarks``
switches phases from Lightning's hooks; ``saved_bytes`` counts the activations autograd keeps for backward (parameters
excluded). Nothing here knows about the package: it counts dense models alike.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

PHASES = ("forward", "backward", "optimizer", "callback", "loop")

_aten = torch.ops.aten
#: Ops that allocate, reinterpret or read metadata: no kernel on a GPU.
NO_KERNEL = {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided,
             _aten._unsafe_view, _aten.lift_fresh, _aten.set_, _aten.resize_, _aten.detach, _aten.alias,
             _aten.is_same_size, _aten.sym_size, _aten.sym_stride, _aten.sym_numel, _aten.sym_storage_offset}
#: Ops that read a device value on the host: a sync on a GPU (and no kernel of their own).
SYNCS = {_aten._local_scalar_dense, _aten.is_nonzero, _aten.item, _aten.equal}


@dataclass
class PhaseCount:
    """One phase's tally: kernels, host syncs, GEMM FLOPs, bytes moved by the other ops, kernels by op name."""

    kernels: int = 0
    syncs: int = 0
    gemm_flops: int = 0
    misaligned_gemm_flops: int = 0
    other_bytes: int = 0
    ops: Counter = field(default_factory=Counter)

    def add(self, other: PhaseCount) -> None:
        self.kernels += other.kernels
        self.syncs += other.syncs
        self.gemm_flops += other.gemm_flops
        self.misaligned_gemm_flops += other.misaligned_gemm_flops
        self.other_bytes += other.other_bytes
        self.ops.update(other.ops)


def rows_aligned(tensor: torch.Tensor) -> bool:
    """Whether a matrix operand (the last two dims) has one unit stride, and its other stride and its offset in whole
    16-byte steps: what cuBLAS's fast GEMM kernels need (else it falls back to kernels of 1- or 2-element alignment)."""
    if tensor.dim() < 2:
        return True
    rows, cols = tensor.stride()[-2:]
    if 1 not in (rows, cols):
        return False
    lead = rows if cols == 1 else cols
    return all(value * tensor.element_size() % 16 == 0 for value in (lead, tensor.storage_offset()))


def _bytes(values: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor))


def _foreach_written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an in-place multi-tensor op writes (its schema's mutable arguments)."""
    if not (func._schema.is_mutable and func.__name__.startswith("_foreach")):
        return []
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            written += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return written


class OpTally(TorchDispatchMode):
    """Count what the dispatched ops cost, per phase, while ``counting``."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "loop"
        self.counting = False
        self.counts = {phase: PhaseCount() for phase in PHASES}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for tensor in _foreach_written(func, args, kwargs):  # under a Python mode their version bump is lost: code that
            torch.autograd.graph.increment_version(tensor)  # reads versions (``TTModule.masks_latched``) must see it
        if not self.counting or func.is_view:
            return out
        packet = func.overloadpacket
        count = self.counts[self.phase]
        if func.namespace == "profiler":  # record_function marks
            return out
        if packet in SYNCS:
            count.syncs += 1
        elif packet not in NO_KERNEL:
            count.kernels += 1
            count.ops[packet.__name__] += 1
            if packet in flop_registry:
                flops = flop_registry[packet](*args, **kwargs, out_val=out)
                count.gemm_flops += flops
                if not all(rows_aligned(t) for t in (*tree_leaves(args), out) if isinstance(t, torch.Tensor)):
                    count.misaligned_gemm_flops += flops
            else:
                count.other_bytes += _bytes(args) + _bytes(kwargs) + _bytes(out)
        return out

    @contextlib.contextmanager
    def phase_of(self, phase: str) -> Iterator[None]:
        """Count what runs inside under ``phase``, then go back to the phase before."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def in_phase(self, phase: str, function: Callable) -> Callable:
        """``function`` counted under ``phase``."""
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self.phase_of(phase):
                return function(*args, **kwargs)
        return counted


class SavedBytes:
    """Bytes of the distinct non-parameter storages autograd saves for backward while it is entered."""

    def __init__(self, parameters: list[torch.Tensor]) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in parameters}
        self.storages: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.skip:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def hooks(self) -> contextlib.AbstractContextManager:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    @property
    def total(self) -> int:
        return sum(self.storages.values())


class PhaseMarks(L.Callback):
    """Phases from Lightning's hooks over the training steps ``[first, first + steps)``; put one instance first and
    one last among the callbacks (``at_end=True``): the callbacks between them count as the callback phase.

    The optimizers' step pre- and post-hooks (the gates' own step, the core step rule) count as the callback phase too,
    and so does ``objective`` of any callback that has one (the loss it adds in ``training_step``).
    """

    def __init__(self, tally: OpTally, first: int, steps: int, at_end: bool = False) -> None:
        self.tally, self.first, self.steps, self.at_end = tally, first, steps, at_end
        self.saved: SavedBytes | None = None
        self._hooks: contextlib.ExitStack | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end:
            return
        for optimizer in trainer.optimizers:
            for hooks in (optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks):
                for key, hook in list(hooks.items()):
                    hooks[key] = self.tally.in_phase("callback", hook)
        for callback in trainer.callbacks:
            if callable(getattr(callback, "objective", None)):
                callback.objective = self.tally.in_phase("callback", callback.objective)
        self.saved = SavedBytes(list(pl_module.parameters()))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.at_end:
            return
        step = trainer.global_step
        self.tally.counting = self.first <= step < self.first + self.steps
        self.tally.phase = "forward"
        if step == self.first:  # the activations of one step's forward
            self._hooks = contextlib.ExitStack()
            self._hooks.enter_context(self.saved.hooks())

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if not self.at_end:
            self.tally.phase = "backward"
            if self._hooks is not None:
                self._hooks.close()
                self._hooks = None

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.at_end:
            self.tally.phase = "optimizer"

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.tally.phase = "loop" if self.at_end else "callback"

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.tally.counting = False
