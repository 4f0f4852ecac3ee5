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

from benchmarks.quality import models, race, report, settings, sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_KEYS = {"curve", "final_val_loss", "parameters", "compressible_parameters", "memory", "train_seconds", "steps"}


@pytest.fixture(scope="module")
def quick_race(tmp_path_factory):
    out = tmp_path_factory.mktemp("quality") / "quality.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.quality", "--quick", "--steps", "8", "--epochs", "2", "--val-batches", "2",
                           "--lrs", "1e-3,3e-3", "--seeds", "1", "--min-lr", "0.1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_quick_race_runs_every_system_at_every_lr_and_reports_each_at_its_best(quick_race):
    out, stdout = quick_race
    results = json.loads(out.read_text())
    assert {"command", "machine", "settings", "models"} <= set(results)
    (entry,) = results["models"].values()
    assert list(entry["systems"]) == list(race.SYSTEMS)
    assert list(entry["lrs"]) == ["0.001", "0.003"] and entry["steps"] == 8
    for lr, part in entry["lrs"].items():
        assert list(part["systems"]) == [s for s in race.SYSTEMS if s != "dense_time"]
        assert all(result["lr"] == float(lr) and result["steps"] == 8 for result in part["systems"].values())
    for name, lr in entry["best_lr"].items():
        losses = {key: part["systems"][name]["final_val_loss"] for key, part in entry["lrs"].items()}
        assert losses[lr] == min(losses.values()) and entry["systems"][name]["lr"] == float(lr), name
    assert entry["systems"]["dense_time"]["lr"] == entry["systems"]["dense"]["lr"]
    seeded = entry["seeds"]["comera"]
    assert seeded["seeds"] == [0, 1] and len(seeded["val_losses"]) == 2 and seeded["val_losses"][0] != seeded["val_losses"][1]
    assert set(entry["seeds"]) == {"dense", "comera"}
    for name, result in entry["systems"].items():
        assert SYSTEM_KEYS <= set(result), name
        assert result["curve"] and all(p["val_loss"] > 0 for p in result["curve"]), name
        assert result["memory"]["tensor_peak"] > result["memory"]["tensor_bytes_before"] > 0, name
    systems = entry["systems"]
    assert abs(systems["narrow"]["parameters"] / systems["comera"]["parameters"] - 1) < 0.15
    assert systems["lowrank"]["compressible_parameters"] <= systems["comera"]["compressible_parameters"]
    assert systems["dense"]["steps"] == 8 and systems["dense_time"]["steps"] >= 1
    assert systems["dense"]["curve"][-1]["tokens"] == 8 * 8 * 64  # steps x batch x block
    assert set(entry["summary"]["systems"]) == set(race.SYSTEMS)
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| llama-128x2 | comera |" in stdout and "2 seeds" in stdout and "| lr 0.003 |" in stdout


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


def test_a_token_budget_sets_the_steps_in_whole_epochs():
    budget = settings.RaceSettings(tokens_per_param=20, batch_size=32, block_size=128, epochs=8)
    assert budget.steps_for(493_344) == 2_408  # 20 x 493,344 / 4,096 = 2,409 steps, in 8 epochs of 301
    assert settings.RaceSettings(steps=400).steps_for(493_344) == 400


def test_the_best_lr_is_the_lowest_finite_loss():
    def run(loss):
        return {"final_val_loss": loss}

    grid = {"0.001": {"dense": run(2.0), "comera": run(2.5)}, "0.003": {"dense": run(float("nan")), "comera": run(2.2)}}
    assert sweep.best_lrs(grid) == {"dense": "0.001", "comera": "0.003"}
    args = race.parse_args(["--lrs", "3e-4,1e-3", "--seeds", "1,2", "--warmup", "0.1"])
    assert settings.settings_of(args).swept_lrs == [3e-4, 1e-3] and settings.settings_of(args).seeds == [1, 2]
    with pytest.raises(SystemExit):
        settings.settings_of(race.parse_args(["--lrs", "fast"]))


def test_one_pass_leaves_comera_the_schedule_its_defaults_take_from_max_steps():
    callback = race.comera_callback(settings.RaceSettings(one_pass=True))
    schedule = callback.schedule  # no stage lengths or interval given: the budget's prunes, planned from max_steps
    assert (schedule.early_epochs, schedule.early_steps, schedule.interval_given) == (None, None, False)
    own = race.comera_callback(settings.RaceSettings(one_pass=True, comera={"early_epochs": 3, "prune_every_n_steps": 50}))
    assert (own.schedule.early_epochs, own.schedule.prune_every_n_steps) == (3, 50)


def test_validation_files_need_training_files_and_a_step_counts_its_accumulated_batches():
    with pytest.raises(SystemExit, match=r"--val-files needs --data-files"):
        settings.settings_of(race.parse_args(["--val-files", "c4-validation.json.gz"]))
    args = settings.settings_of(race.parse_args(["--accumulate", "4", "--batch-size", "8", "--block-size", "64"]))
    assert args.tokens_per_step == 4 * 8 * 64 and args.steps_for(0) == 400
    with pytest.raises(SystemExit, match=r"--accumulate must be >= 1"):
        settings.settings_of(race.parse_args(["--accumulate", "0"]))


def test_the_profiled_step_is_excluded_whole_when_gradients_accumulate(monkeypatch):
    from types import SimpleNamespace

    from benchmarks.quality import lm

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(lm.time, "perf_counter", lambda: clock.now)
    curve, trainer = lm.Curve(measured_step=1), SimpleNamespace(global_step=0)
    curve.on_train_start(trainer, None)
    for step, seconds in enumerate([1.0, 10.0, 1.0]):  # step 1 runs under the profiler: 9 s of overhead
        for half in range(2):  # two accumulated batches a step
            curve.on_train_batch_start(trainer, None, None, half)
            clock.now += seconds / 2
            trainer.global_step = step + half  # the optimizer steps after the second batch
            curve.on_train_batch_end(trainer, None, None, None, half)
    assert curve.train_seconds == 3.0
