"""Peak bytes of live CPU tensors during a step: the CPU counterpart of ``torch.cuda.max_memory_allocated`` (which
``cuda_peak`` reads for a step on a GPU).

A process's resident set also holds the interpreter and the libraries (``import torch`` alone is
about 0.23 GB resident, with Lightning about 0.35 GB), which a GPU's allocator statistics never
see. This probe counts only what torch's allocator hands out: the bytes alive when the step starts
(weights, optimizer state, the batch; distinct storages once) plus the highest running sum of the
allocations and frees that ``torch.profiler`` records (``profile_memory=True``) during the step.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator


def storage_bytes(tensors: Iterable[object]) -> int:
    """Bytes of the distinct CPU storages behind ``tensors`` (non-tensors are skipped)."""
    import torch

    seen: dict[int, int] = {}
    for tensor in tensors:
        if torch.is_tensor(tensor) and tensor.device.type == "cpu":
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: Any) -> Iterator[Any]:
    """The optimizer's state tensors, GaLore's projection matrices included."""
    import torch

    for state in optimizer.state.values():
        for value in state.values():
            matrices = getattr(value, "ortho_matrix", value)  # a GaLoreProjector keeps its projector here
            for tensor in matrices if isinstance(matrices, tuple) else (matrices,):
                if torch.is_tensor(tensor):
                    yield tensor


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's state tensors, GaLore's projection matrices included."""
    return sum(t.numel() * t.element_size() for t in optimizer_state_tensors(optimizer))


def allocation_peak(step: Callable[[], object]) -> tuple[int, int]:
    """Run ``step`` under the profiler; (highest net bytes allocated at any moment, net bytes at the end)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    cpu = torch._C._autograd.DeviceType.CPU
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == cpu), key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak, current


def tensor_peak(step: Callable[[], object], live: Iterable[object]) -> dict[str, int]:
    """Bytes alive before ``step`` (``live``), the step's allocation peak on top, and their sum."""
    before = storage_bytes(live)
    peak, net = allocation_peak(step)
    return {"tensor_bytes_before": before, "tensor_peak": before + peak, "tensor_net_after": net}


def cuda_peak(step: Callable[[], object], device: Any) -> dict[str, int]:
    """``tensor_peak`` on a CUDA device, from the allocator's own counts: bytes allocated before ``step``, the peak
    during it (everything allocated on the device then), the net change."""
    import torch

    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return {"tensor_bytes_before": before, "tensor_peak": torch.cuda.max_memory_allocated(device),
            "tensor_net_after": torch.cuda.memory_allocated(device) - before}
