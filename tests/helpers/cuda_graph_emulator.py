"""A CPU stand-in for torch's CUDA-graph API, so the capture bookkeeping of CUDAGraphStrategy runs in CPU tests.

:func:`emulate_cuda_graphs` patches ``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``graph_pool_handle``,
the stream calls, and lets the capturable optimizer path run on CPU. An :class:`EmulatedGraph` keeps
what a real graph keeps: while "capturing" it runs the step once and records every aten call with its
tensors; :meth:`EmulatedGraph.replay` re-runs those calls on the same tensors, writing results into
the tensors the capture produced. So, as on a GPU, Python in the step runs only at capture, Python
numbers (a float learning rate) are frozen into the recorded calls, tensors are static, and a host
sync during capture fails. Randomness differs from a GPU's (replays draw from the CPU generator).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
#: Calls that read a device value on the host: a real capture fails on them.
HOST_SYNCS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten._unique2.default,
              aten.nonzero.default, aten.masked_select.default}


class HostSyncCounter(TorchDispatchMode):
    """Counts the calls that would make the host wait for the GPU (``.item()``, ``bool()``, ``unique``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_SYNCS:
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    """Records the calls of a capture; tensors from before it that the calls write are restored when it ends
    (a real capture runs no kernel: the first replay is the step's first execution)."""

    def __init__(self, tape: list) -> None:
        super().__init__()
        self.tape = tape
        self.created: set[int] = set()
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_SYNCS:
            raise RuntimeError(f"emulated capture: {func} reads a device value on the host (operation not permitted when stream is capturing)")
        schema = func._schema
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                for t in tree_leaves(value):
                    if isinstance(t, torch.Tensor) and id(t) not in self.created and id(t) not in self.saved:
                        self.saved[id(t)] = (t, t.detach().clone())
        out = func(*args, **kwargs)
        aliases = bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
        if schema.is_mutable or not aliases:  # pure views need no re-run: they share the storage
            fresh = [] if aliases else [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.created.update(map(id, fresh))
            self.tape.append((func, args, kwargs, fresh))
        return out

    def restore(self) -> None:
        # Newest first: a view written later (``p.detach()``) saved a later state of memory saved before through ``p``.
        with torch.no_grad():
            for t, before in reversed(list(self.saved.values())):
                t.copy_(before)


class EmulatedGraph:
    """One recorded step; ``pool`` is the pool handle the capture was given (None: a private pool)."""

    instances: list[EmulatedGraph] = []
    fail_capture_number: int | None = None  # this capture (1: the first) runs out of memory
    captures = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.tape: list = []
        self.pool: Any = None
        self.replays = 0
        EmulatedGraph.instances.append(self)

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, fresh in self.tape:
                out = func(*args, **kwargs)
                for dst, src in zip(fresh, [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]):
                    dst.copy_(src)
        self.replays += 1


_capturing = [False]


@contextmanager
def _graph(cuda_graph: EmulatedGraph, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
    EmulatedGraph.captures += 1
    if EmulatedGraph.captures == EmulatedGraph.fail_capture_number:
        raise torch.OutOfMemoryError("CUDA out of memory (emulated)")
    cuda_graph.pool = pool
    recorder = _Recorder(cuda_graph.tape)
    _capturing[0] = True
    try:
        with recorder:
            yield
    finally:  # a capture, failed or not, ran no kernel
        recorder.restore()
        _capturing[0] = False


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextmanager
def emulate_cuda_graphs(monkeypatch, strategy_cls=None):
    """Patch torch.cuda's graph API with the CPU emulation (and, given the strategy class, let it capture on CPU)."""
    import importlib

    adam = importlib.import_module("torch.optim.adam")
    EmulatedGraph.instances, EmulatedGraph.fail_capture_number, EmulatedGraph.captures = [], None, 0
    real_available = torch.cuda.is_available
    monkeypatch.setattr(torch.cuda, "CUDAGraph", EmulatedGraph)
    monkeypatch.setattr(torch.cuda, "graph", _graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda *a, **k: nullcontext())
    monkeypatch.setattr(torch.cuda, "set_stream", lambda *a, **k: None)
    # code asks "is a capture under way?" as `is_available() and is_current_stream_capturing()`
    monkeypatch.setattr(torch.cuda, "is_available", lambda: _capturing[0] or real_available())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: _capturing[0])
    supported = adam._get_capturable_supported_devices
    monkeypatch.setattr(adam, "_get_capturable_supported_devices", lambda *a, **k: [*supported(*a, **k), "cpu"])
    from comera_lightning.optim.gates import GateOptimizer

    attach = GateOptimizer.attach

    def attach_capturable(self, *args, **kwargs):  # as on a GPU, where the gates' Adam is capturable
        attach(self, *args, **kwargs)
        if self.optimizer is not None:
            self.optimizer.defaults["capturable"] = True
            for group in self.optimizer.param_groups:
                group["capturable"] = True

    monkeypatch.setattr(GateOptimizer, "attach", attach_capturable)
    if strategy_cls is not None:
        refusal = strategy_cls.capture_refusal

        def capture_on_cpu(self, trainer):
            reason = refusal(self, trainer)
            return None if reason is not None and reason.startswith("no CUDA device") else reason

        monkeypatch.setattr(strategy_cls, "capture_refusal", capture_on_cpu)
    yield EmulatedGraph
