"""The race's results: the summary per model, the README's markdown table, merging, the JSON and the PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.plots import plot_quality

MIB = 2**20


def loss_at_seconds(curve: list[dict[str, float]], seconds: float) -> float | None:
    """Validation loss at ``seconds`` of training, interpolated linearly between a curve's points.

    Past the curve's end, its last value (the run had finished); before its first point, None.
    """
    if not curve or seconds < curve[0]["seconds"]:
        return None
    for left, right in zip(curve, curve[1:]):
        if left["seconds"] <= seconds <= right["seconds"]:
            span = right["seconds"] - left["seconds"]
            share = (seconds - left["seconds"]) / span if span > 0 else 1.0
            return round(left["val_loss"] + share * (right["val_loss"] - left["val_loss"]), 4)
    return curve[-1]["val_loss"]


def _relative(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return round(100 * (value / reference - 1), 2)


def summarize(systems: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per system: val loss at equal steps (vs dense) and at comera's training seconds (vs dense there)."""
    dense = systems.get("dense")
    budget = systems.get("comera", dense or {}).get("train_seconds")
    dense_at_budget = loss_at_seconds(dense["curve"], budget) if dense and budget else None
    rows = {}
    for name, result in systems.items():
        at_budget = loss_at_seconds(result["curve"], budget) if budget else None
        rows[name] = {
            "lr": result.get("lr"), "steps": result["steps"], "val_loss": result["final_val_loss"],
            "val_loss_vs_dense_pct": _relative(result["final_val_loss"], dense and dense["final_val_loss"]),
            "val_loss_at_budget": at_budget, "val_loss_at_budget_vs_dense_pct": _relative(at_budget, dense_at_budget),
            "parameters": result["parameters"], "compressible_parameters": result["compressible_parameters"],
            "peak_mib": round(result["memory"].get("tensor_peak", 0) / MIB, 1), "train_seconds": result["train_seconds"],
        }
    return {"budget_seconds": budget, "systems": rows}


def _number(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _signed(value: float | None) -> str:
    return "" if value is None else f" ({value:+.1f} %)"


def _seeded(row: dict[str, Any], spread: dict[str, Any] | None, dense_spread: dict[str, Any] | None) -> str:
    """The loss (vs dense); with seeds, the mean over seeds ± half their range, vs dense's mean when it has seeds too."""
    if not spread:
        return f"{row['val_loss']:.3f}{_signed(row['val_loss_vs_dense_pct'])}"
    relative = _relative(spread["mean"], dense_spread["mean"]) if dense_spread else row["val_loss_vs_dense_pct"]
    return f"{spread['mean']:.3f} ± {spread['spread'] / 2:.3f}{_signed(relative)}, {len(spread['val_losses'])} seeds"


def markdown_table(results: dict[str, Any]) -> str:
    """One row per (model, system), each system at its best LR of the sweep: what the README shows.

    With seeds, the loss is the mean over seeds ± half their range."""
    lines = ["| model | system | lr | parameters | compressible | steps | val loss (vs dense) | val loss at comera's "
             "seconds (vs dense) | train s | peak MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model, entry in results["models"].items():
        summary, seeds = entry["summary"], entry.get("seeds", {})
        for name, row in summary["systems"].items():
            lines.append(
                f"| {model} | {name} | {_number(row.get('lr'), 'g')} | {row['parameters']:,} | "
                f"{row['compressible_parameters']:,} | {row['steps']} | "
                f"{_seeded(row, seeds.get(name), seeds.get('dense'))} | "
                f"{_number(row['val_loss_at_budget'], '.3f')}{_signed(row['val_loss_at_budget_vs_dense_pct'])} | "
                f"{row['train_seconds']:.0f} | {_number(row['peak_mib'], '.0f')} |")
    budgets = ", ".join(f"{m} {_number(e['summary']['budget_seconds'], '.0f')} s" for m, e in results["models"].items())
    notes = (f"\nVal loss: nats per BPE token on held-out files, after each system's last step. Comera's training "
             f"seconds (the equal wall-clock budget): {budgets}; each curve interpolated there, its last value if it "
             "ended sooner. Compressible: parameters in the layers CoMERA tensorized. Peak: tensor peak of a training step.")
    return "\n".join(lines) + "\n" + notes


def grid_table(results: dict[str, Any]) -> str:
    """Final validation loss of every system at every swept LR (vs dense at the same LR); the best per system in bold."""
    lines = []
    for model, entry in results["models"].items():
        grid = entry.get("lrs")
        if not grid:
            continue
        names = list(next(iter(grid.values()))["systems"])
        lines += [f"| {model} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for lr, part in grid.items():
            cells = []
            for name in names:
                row = part["summary"]["systems"].get(name)
                if row is None:
                    cells.append("–")
                    continue
                text = f"{row['val_loss']:.3f}{_signed(row['val_loss_vs_dense_pct'])}"
                cells.append(f"**{text}**" if entry["best_lr"].get(name) == lr else text)
            lines.append(f"| lr {lr} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def merge(paths: list[str]) -> dict[str, Any]:
    """Several race JSONs (e.g. one per process) as one: their models side by side, the first one's settings."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    merged = {key: value for key, value in parts[0].items() if key != "models"}
    merged["models"] = {}
    merged["sources"] = [{"path": Path(p).name, "command": part.get("command"), "machine": part.get("machine")}
                         for p, part in zip(paths, parts)]
    for path, part in zip(paths, parts):
        if part.get("settings") != parts[0].get("settings"):
            merged.setdefault("settings_differ", []).append(Path(path).name)
        merged["models"].update(part["models"])
    return merged


def write(results: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """The JSON at ``out`` and the loss-vs-seconds PNG beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    png = plot_quality(results, out.with_suffix(".png"))
    return out, png
