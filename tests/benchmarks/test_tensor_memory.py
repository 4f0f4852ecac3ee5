"""benchmarks/tensor_memory.py: the tensor peak counts live bytes and the step's allocations, not the process."""

import torch

from benchmarks.tensor_memory import allocation_peak, storage_bytes, tensor_peak


def test_storage_bytes_counts_each_storage_once():
    weight = torch.zeros(1000, 250)  # 1,000,000 bytes
    assert storage_bytes([weight, weight.t(), weight[:10], "not a tensor", torch.zeros(3, dtype=torch.float64)]) == 1_000_024


def test_allocation_peak_sees_a_temporary_that_is_freed():
    def step():
        first = torch.ones(2_000_000, dtype=torch.uint8)
        second = first.clone()  # both alive: 4 MB
        del first, second
        return torch.ones(500_000, dtype=torch.uint8)  # freed as the result is dropped by the caller

    peak, net = allocation_peak(step)
    assert 4_000_000 <= peak < 4_100_000
    assert net == 0


def test_tensor_peak_adds_live_bytes_before_the_step():
    live = [torch.zeros(250_000)]  # 1 MB
    result = tensor_peak(lambda: torch.zeros(500_000).sum(), live)
    assert result["tensor_bytes_before"] == 1_000_000
    assert 3_000_000 <= result["tensor_peak"] < 3_100_000
