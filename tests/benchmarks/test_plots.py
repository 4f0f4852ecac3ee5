"""benchmarks/plots.py draws the optimizer, DLRM and compression charts from the scripts' JSON shapes."""

from pathlib import Path

from benchmarks.plots import plot_compression, plot_dlrm, plot_optimizers


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_optimizer_chart(tmp_path):
    state = {"optimizers": {"AdamW": {"state_bytes": 8 << 20}, "CAME": {"state_bytes": 4 << 20}}}
    rows = {"dense": {"AdamW": {"tensor_peak": 900 << 20}, "CAME": {"tensor_peak": 700 << 20}}}
    assert _is_png(plot_optimizers({"dense": state, "tensorized": state, "peak_per_process": {"rows": rows}}, tmp_path / "o.png"))


def test_dlrm_chart_hatches_computed_rows(tmp_path):
    results = {"16": {"tt": {"status": "measured", "peak": 7e8, "step_ms_median": 1700.0},
                      "dense": {"status": "measured", "peak": 7.8e9, "step_ms_median": 9400.0}},
               "128": {"tt": {"status": "measured", "peak": 1e9, "step_ms_median": 6000.0},
                       "dense": {"status": "computed", "peak": 5.7e10}}}
    assert _is_png(plot_dlrm({"results": results}, tmp_path / "d.png"))


def test_compression_chart_skips_failed_workloads(tmp_path):
    ok = {"end_of_early_stage": {"compression_model": 6.9, "compression_tt": 11.9},
          "final": {"compression_model": 11.2, "compression_tt": 42.3}, "test_metrics": {"test/acc": 0.84, "test/loss": 0.4}}
    parts = {"transformer": ok, "dlrm": {"returncode": 1, "stderr_tail": "boom"}}
    assert _is_png(plot_compression(parts, tmp_path / "c.png"))
