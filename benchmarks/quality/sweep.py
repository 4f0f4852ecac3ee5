"""One model's race over a sweep of learning rates: every system at every LR, the headline at each one's best.

A comparison is only fair when every system gets its best LR from the same sweep (docs/TUNING_LONG_RACE.md, "The
long-horizon race"). Per model: each system of the race at each peak LR of ``settings.swept_lrs``
(``runs.race_at_lr``; the narrow and low-rank baselines take CoMERA's size at that LR); each system's best LR
(lowest final validation loss); ``dense_time`` (dense at its best LR given CoMERA's training seconds at its
best LR); and, with ``settings.seeds``, the headline systems rerun at their best LR with each further seed.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.quality import report
from benchmarks.quality.models import ModelSpec, dense_parameters
from benchmarks.quality.runs import fit, print_result, race_at_lr
from benchmarks.quality.settings import RaceSettings

__all__ = ["race_model", "best_lrs", "lr_key"]


def lr_key(lr: float) -> str:
    """How an LR names its entry in the JSON (``"0.001"``)."""
    return f"{lr:g}"


def best_lrs(grid: dict[str, dict[str, dict[str, Any]]]) -> dict[str, str]:
    """Each system's LR key with the lowest final validation loss (a diverged run, NaN, never wins)."""
    best = {}
    for name in dict.fromkeys(name for results in grid.values() for name in results):
        losses = {lr: results[name]["final_val_loss"] for lr, results in grid.items() if name in results}
        finite = {lr: loss for lr, loss in losses.items() if loss == loss}
        best[name] = min(finite or losses, key=(finite or losses).__getitem__)
    return best


def _dense_time(spec: ModelSpec, settings: RaceSettings, data: Any, dense: dict[str, Any], comera: dict[str, Any]) -> dict[str, Any]:
    """Dense at its best LR, its own warm-up + cosine over the steps that fit in CoMERA's training seconds."""
    steps = max(1, int(comera["train_seconds"] / (dense["train_seconds"] / dense["steps"])))
    per_epoch = max(1, dense["steps"] // max(1, len(dense["curve"])))
    result, _ = fit("dense_time", spec, settings, data, lr=dense["lr"], steps=steps, per_epoch=per_epoch)
    result.pop("layer_sizes")
    result["compressible_parameters"] = dense["compressible_parameters"]
    print_result(result)
    return result


def _seed_runs(spec: ModelSpec, settings: RaceSettings, data: Any, best: dict[str, dict[str, Any]],
               steps: int) -> dict[str, dict[str, Any]]:
    """The headline systems at their best LR with each of ``settings.seeds``: losses, mean and spread."""
    spread = {}
    for name in [n for n in settings.seed_systems if n in best and n in ("dense", "comera")]:
        losses = [best[name]["final_val_loss"]]
        for seed in settings.seeds:
            result, _ = fit(name, spec, settings, data, lr=best[name]["lr"], steps=steps, seed=seed)
            print_result(result)
            losses.append(result["final_val_loss"])
        spread[name] = {"seeds": [settings.seed, *settings.seeds], "val_losses": losses,
                        "mean": round(statistics.fmean(losses), 4), "spread": round(max(losses) - min(losses), 4)}
    return spread


def race_model(spec: ModelSpec, settings: RaceSettings, data: Any, systems: list[str]) -> dict[str, Any]:
    """Every system of ``systems`` on ``spec`` at every swept LR; the headline ``systems`` at their best LRs."""
    steps = settings.steps_for(dense_parameters(spec, data.vocab_size, settings.block_size))
    grid = {lr_key(lr): race_at_lr(spec, settings, data, systems, lr, steps) for lr in settings.swept_lrs}
    chosen = best_lrs(grid)
    best = {name: grid[lr][name] for name, lr in chosen.items()}
    if "dense_time" in systems:
        best["dense_time"] = _dense_time(spec, settings, data, best["dense"], best["comera"])
    entry: dict[str, Any] = {"steps": steps, "tokens": steps * settings.tokens_per_step,
                             "best_lr": chosen, "systems": best}
    if len(grid) > 1:
        entry["lrs"] = {lr: {"systems": results, "summary": report.summarize(results)} for lr, results in grid.items()}
    if settings.seeds:
        entry["seeds"] = _seed_runs(spec, settings, data, best, steps)
    entry["summary"] = report.summarize(best)
    return entry
