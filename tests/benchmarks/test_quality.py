"""benchmarks/quality: the race end to end on a tiny Llama (one subprocess), and its pieces without training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("pytorch_optimizer")

from benchmarks.quality import models, race, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_KEYS = {"curve", "final_val_loss", "parameters", "compressible_parameters", "memory", "train_seconds", "steps"}


@pytest.fixture(scope="module")
def quick_race(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality") / "quality.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.quality", "--quick", "--steps", "16", "--epochs", "2", "--val-batches", "2",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_quick_race_runs_every_system_and_reports_them(quick_race):
    out, stdout = quick_race
    results = json.loads(out.read_text())
    assert {"command", "machine", "settings", "models"} <= set(results)
    (entry,) = results["models"].values()
    assert list(entry["systems"]) == list(race.SYSTEMS)
    for name, result in entry["systems"].items():
        assert SYSTEM_KEYS <= set(result), name
        assert result["curve"] and all(p["val_loss"] > 0 for p in result["curve"]), name
        assert result["memory"]["tensor_peak"] > result["memory"]["tensor_bytes_before"] > 0, name
    systems = entry["systems"]
    assert abs(systems["narrow"]["parameters"] / systems["comera"]["parameters"] - 1) < 0.15
    assert systems["lowrank"]["compressible_parameters"] <= systems["comera"]["compressible_parameters"]
    assert systems["dense"]["steps"] == 16 and systems["dense_time"]["steps"] >= 1
    assert set(entry["summary"]["systems"]) == set(race.SYSTEMS)
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| llama-128x2 | comera |" in stdout


def test_merge_puts_the_models_of_two_runs_side_by_side(quick_race, tmp_path):
    out, _ = quick_race
    other = json.loads(out.read_text())
    other["models"] = {"gpt2-64x1": next(iter(other["models"].values()))}
    second = tmp_path / "other.json"
    second.write_text(json.dumps(other))
    race.main(["--merge", str(out), str(second), "--out", str(tmp_path / "merged.json")])
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert list(merged["models"]) == ["llama-128x2", "gpt2-64x1"]
    assert (tmp_path / "merged.png").exists() and len(merged["sources"]) == 2


def test_low_rank_fits_the_budget_with_one_rank():
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 64), nn.Linear(64, 32, bias=False))
    rank = models.low_rank_(model, ["0", "1", "2"], budget=2_000)
    assert isinstance(model[0], models.LowRankEmbedding) and isinstance(model[1], models.LowRankLinear)
    assert rank == 5 and models.parameters(model) == 5 * (132 + 96 + 96) + 64  # rank 6 would need 2,008
    assert model(torch.tensor([[1, 2]])).shape == (1, 2, 32)


def test_narrow_width_is_the_closest_count():
    spec = models.ModelSpec("gpt2", 256, 2)
    target = models.dense_parameters(spec.with_width(128), 512, 32) + 10
    assert models.narrow_width(spec, target, 512, 32) == 128
    assert models.attention_heads(224) == 2 and models.attention_heads(96) == 1


def test_loss_at_seconds_interpolates_and_holds_the_last_value():
    curve = [{"seconds": 1.0, "val_loss": 4.0}, {"seconds": 3.0, "val_loss": 2.0}]
    assert report.loss_at_seconds(curve, 2.0) == 3.0
    assert report.loss_at_seconds(curve, 9.0) == 2.0
    assert report.loss_at_seconds(curve, 0.5) is None


def test_systems_that_need_comera_are_refused_without_it():
    with pytest.raises(SystemExit):
        race.parse_args(["--systems", "dense,narrow"])
