"""benchmarks/training/transformer_speed.py on a tiny encoder: every system trains, pruning and memory probes work."""

import importlib

import pytest
import torch

pytest.importorskip("pytorch_optimizer")

TINY = ["--layers", "1", "--d-model", "128", "--d-ff", "512", "--heads", "2", "--vocab", "500", "--seq", "8",
        "--steps", "2", "--warmup", "1", "--threads", "1"]


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.training.transformer_speed")


def test_interleaved_run_times_every_system_and_prunes_a_third_of_each_bond(bench):
    args = bench.parse_args(TINY)
    rows = bench.run_interleaved(1, args)
    assert list(rows) == ["dense", "galore", "comera", "comera_pruned"]
    assert all(r["step_ms_median"] > 0 for r in rows.values())
    assert rows["galore"]["step_ms_amortized"] > rows["galore"]["step_ms_median"]
    for name, ranks in rows["comera_pruned"]["ranks"].items():
        full = rows["comera"]["ranks"][name]
        assert ranks == [max(1, round(r / 3)) for r in full]
    assert rows["comera_pruned"]["tt_compression"] > 2 * rows["comera"]["tt_compression"]
    claims = bench.check_claims(bench.ratios({1: rows}, {}))
    assert set(claims) == {"galore_over_comera_time_b1", "galore_over_comera_pruned_time_b1"}


def test_worker_measures_memory_after_pruning(bench):
    threads = torch.get_num_threads()
    try:
        result = bench.run_worker("comera_pruned", 2, bench.parse_args(TINY))
    finally:
        torch.set_num_threads(threads)
    assert result["peak"] >= result["rss_model_state"] > 0
    assert result["optimizer_state_bytes"] > 0 and len(result["step_ms_all"]) == 2
    assert result["tensor_peak"] > result["tensor_bytes_before"] >= result["optimizer_state_bytes"]


def test_cuda_device_is_refused_clearly_without_a_gpu(bench, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench.main([*TINY, "--device", "cuda", "--no-processes"])


@pytest.mark.gpu
def test_worker_on_cuda_reads_the_allocator_peak(bench):
    result = bench.run_worker("comera", 2, bench.parse_args([*TINY, "--device", "cuda"]))
    assert result["tensor_peak"] >= result["tensor_bytes_before"] > 0
    assert all(loss == loss for loss in result["losses"])
