"""benchmarks/inference/table_speed.py --quick: dense and TT tables timed side by side, sized, and checked exact."""

import json

import torch

from benchmarks.inference import table_speed


def test_quick_run_times_sizes_and_checks_every_system(tmp_path):
    out = tmp_path / "table_speed.json"
    threads = torch.get_num_threads()
    try:
        report = table_speed.main(["--quick", "--rounds", "2", "--warmup", "1", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert json.loads(out.read_text())["benchmark"] == "table_speed"
    for clock in ("wall", "cpu"):
        timed = report["timing"][clock]
        assert list(timed["ms_median"]) == ["dense", "tt", "tt_pruned", "export_cores", "export_halves"] and all(ms > 0 for ms in timed["ms_median"].values())
        rounds = timed["ms_rounds"]
        paired = sorted(d / t for d, t in zip(rounds["dense"], rounds["tt"]))
        assert len(paired) == 2 and paired[0] <= timed["dense_over_paired"]["tt"] <= paired[-1]
        forms = sorted(c / h for c, h in zip(rounds["export_cores"], rounds["export_halves"]))
        assert forms[0] <= timed["cores_over_halves_paired"] <= forms[-1]
    memory = report["memory"]
    assert memory["bytes"]["dense"] == 100_000 * 64 * 4 and memory["dense_over"]["tt"] > 5
    parts = memory["tt_parts"]["tt"]
    assert parts["cached_rows"] > 0 and parts["hash_index"] > 0 and parts["half_tables"] > 0
    assert sum(parts.values()) == memory["bytes"]["tt"]  # the parts are everything inference_bytes counts
    exact = report["exactness"]
    assert exact["cached_equal_misses_bitwise"] and exact["cached_rows_checked"] > 100
    assert exact["max_abs_vs_training_rows"] <= 1e-5 * exact["max_abs_row_value"] and exact["max_abs_vs_dense"] <= 1e-5 * exact["max_abs_row_value"]
    layout = report["layouts"]
    assert layout["max_relative_difference"] <= 1e-6 and layout["misses_per_batch"] > 0 and set(layout["cpu_ms_median"]) == {"plain", "transposed"}
    assert set(report["phases"]["cpu_ms_median"]) == {"dense", "find", "misses", "gather"} and report["phases"]["misses_per_batch"] > 0
    assert "| tt_pruned |" in report["markdown"] and "--out" not in report["command"]
    assert report["host"]["threads"] == 1
