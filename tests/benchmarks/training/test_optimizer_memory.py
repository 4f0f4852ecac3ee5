"""benchmarks/training/optimizer_memory.py section (c) on a tiny encoder: a worker process measures, ratios follow."""

import importlib
import math

import pytest
import torch

TINY = ["--peak-vocab", "500", "--peak-d-model", "96", "--peak-layers", "1", "--peak-batch", "1", "--peak-steps", "1"]


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.training.optimizer_memory")


def test_worker_process_reports_consistent_memory(bench):
    row = bench.spawn_peak_worker("tensorized", "CAME", bench.parse_args(TINY))
    assert row["status"] == "measured", row.get("stderr_tail")
    assert row["peak_reset"] is True
    assert row["peak"] >= row["rss_model_state"] > row["rss_import"] > 0
    assert row["peak_build"] >= row["rss_built"] > 0
    assert row["optimizer_state_bytes"] > 0 and row["parameters"] > 0
    assert row["tensor_peak"] > row["tensor_bytes_before"] > row["optimizer_state_bytes"]
    assert len(row["step_ms_all"]) == 1 and row["step_ms_median"] > 0
    assert len(row["losses"]) == 2 and all(math.isfinite(loss) for loss in row["losses"])


def test_ratios_vs_adamw_from_in_process_workers(bench):
    args, threads = bench.parse_args(TINY), torch.get_num_threads()
    torch.set_num_threads(1)  # in this process: one thread is quicker for the tiny model on shared cores
    try:
        rows = {"dense": {name: bench.run_peak_worker("dense", name, args) for name in ("AdamW", "Adafactor")}}
    finally:
        torch.set_num_threads(threads)
    assert rows["dense"]["Adafactor"]["optimizer_state_bytes"] < rows["dense"]["AdamW"]["optimizer_state_bytes"]
    ratios = bench.peak_ratios(rows)
    assert list(ratios) == ["dense/Adafactor"]
    expected = rows["dense"]["Adafactor"]["peak"] / rows["dense"]["AdamW"]["peak"]
    assert ratios["dense/Adafactor"]["peak"] == pytest.approx(expected)
    assert ratios["dense/Adafactor"]["peak_net"] > 0


def test_worker_flag_rejects_unknown_configurations(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--worker", "dense,SGD"])
