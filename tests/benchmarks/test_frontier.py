"""benchmarks/quality/frontier: one budget end to end on a tiny byte-level Llama, in this process."""

import json

import pytest

pytest.importorskip("transformers")

from benchmarks.quality import frontier  # noqa: E402


def test_one_budget_runs_every_system_at_the_size_asked(tmp_path):
    out = tmp_path / "frontier.json"
    frontier.main(["--models", "llama:32:1", "--budgets", "4", "--steps", "4", "--epochs", "2", "--max-bytes", "200000",
                   "--vocab-size", "261", "--batch-size", "4", "--block-size", "32", "--val-batches", "2",
                   "--narrow-multiple", "8", "--out", str(out)])
    result = json.loads(out.read_text())
    model = result["models"]["llama-32x1"]
    runs = model["budgets"]["4"]
    assert set(runs) == {"comera", "fixed", "narrow", "lowrank"}
    assert "--out" not in result["command"] and "--narrow-multiple 8" in result["command"], "no local path in the JSON"
    assert runs["narrow"]["width"] % 8 == 0 and runs["narrow"]["width"] < 32, "--narrow-multiple sets the narrow widths"
    dense_layers = model["dense"]["compressible_parameters"]
    assert 3.6 < dense_layers / runs["fixed"]["compressible_parameters"] < 4.4, "fixed ranks train at the size asked"
    assert all(run["steps"] == model["steps"] for run in runs.values())
    assert out.with_suffix(".png").exists()
