"""How many kernels a piece of code would launch: the non-view aten ops it dispatches (benchmarks/training/op_tally.py
counts the same by phase for the step account; tests other than the benchmarks' own do not import benchmarks)."""

from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view
        return func(*args, **(kwargs or {}))


def kernels(function: Callable[[], object]) -> int:
    """Non-view ops ``function()`` dispatches."""
    count = _Count()
    with count:
        function()
    return count.ops
