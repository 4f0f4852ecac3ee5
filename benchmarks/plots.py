"""PNG charts of the benchmark JSONs that do not draw their own: optimizers, DLRM and per-stage compression.

``python -m benchmarks.run`` calls :func:`draw_all` after its parts; ``python -m benchmarks.plots
[--quick]`` redraws them from the JSONs in ``benchmarks/results/`` (``transformer_speed.py`` and
``pruning_speed.py`` draw their own).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
GB = 1e9
MIB = 2**20


def _figure(panels: int, title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), squeeze=False)
    fig.suptitle(title, fontsize=11)
    return fig, axes[0]


def _bars(ax: Any, labels: list[str], values: list[float], title: str, fmt: str, log: bool = False) -> None:
    """One labelled bar per value (missing values are skipped)."""
    shown = [(label, value) for label, value in zip(labels, values) if value is not None]
    ax.bar(range(len(shown)), [v for _, v in shown], color="tab:blue")
    for i, (_, value) in enumerate(shown):
        ax.text(i, value, fmt.format(value), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(shown)), [label for label, _ in shown], rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_optimizers(data: dict[str, Any], path: Path) -> Path:
    """State MiB (dense and tensorized encoder) and whole-training peaks per (model, optimizer)."""
    fig, axes = _figure(3, "CAME vs AdamW vs Adafactor (paper encoder, CPU)")
    for ax, kind in zip(axes[:2], ("dense", "tensorized")):
        rows = data.get(kind, {}).get("optimizers", {})
        _bars(ax, list(rows), [r["state_bytes"] / MIB for r in rows.values()], f"optimizer state, {kind} (MiB)", "{:.1f}", log=True)
    peaks = data.get("peak_per_process", {}).get("rows", {})
    labels = [f"{kind}\n{name}" for kind, by in peaks.items() for name in by]
    values = [r.get("tensor_peak", 0) / MIB or None for by in peaks.values() for r in by.values()]
    _bars(axes[2], labels, values, "whole-training peak of live tensors (MiB, own process)", "{:.0f}", log=True)
    return _save(fig, path)


def plot_dlrm(data: dict[str, Any], path: Path) -> Path:
    """Peak memory and step time of dense vs TT tables per embedding dim (computed dense peaks hatched)."""
    fig, axes = _figure(2, "DLRM at Criteo Kaggle scale: dense vs TT embedding tables (CPU)")
    labels, peaks, times, computed = [], [], [], []
    for dim, rows in data.get("results", {}).items():
        for system, row in rows.items():
            labels.append(f"{system}\ndim {dim}")
            peaks.append(row["peak"] / GB if row.get("peak") else None)
            times.append(row.get("step_ms_median"))
            computed.append(row.get("status") == "computed")
    _bars(axes[0], labels, peaks, "peak resident memory (GB; 'computed' rows hatched)", "{:.2f}", log=True)
    shown = [c for c, p in zip(computed, peaks) if p is not None]
    for patch, is_computed in zip(axes[0].patches, shown):
        if is_computed:
            patch.set_hatch("//")
            patch.set_alpha(0.5)
    _bars(axes[1], labels, times, "training step (ms, median)", "{:.0f}", log=True)
    return _save(fig, path)


def plot_compression(parts: dict[str, Any], path: Path) -> Path:
    """Whole-model and tensorized-layer compression at the end of the early stage and at the end, per workload."""
    fig, axes = _figure(2, "Compression per stage (metric reached at the end in the labels)")
    for ax, key in zip(axes, ("compression_model", "compression_tt")):
        labels, values = [], []
        for name, row in parts.items():
            if "final" not in row:
                continue
            metric = ", ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in row["test_metrics"].items() if not k.endswith("loss"))
            for stage, stage_key in (("early", "end_of_early_stage"), ("final", "final")):
                labels.append(f"{name} {stage}" + (f"\n{metric}" if stage == "final" else ""))
                values.append(row[stage_key].get(key))
        _bars(ax, labels, values, f"{'whole model' if key == 'compression_model' else 'tensorized layers'} (x smaller)", "{:.1f}x")
    return _save(fig, path)


def plot_quality(data: dict[str, Any], path: Path) -> Path:
    """The quality race: validation loss against tokens (top) and training seconds (bottom), one curve per system
    at its best LR, one column per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data.get("models", {})
    fig, axes = plt.subplots(2, max(1, len(models)), figsize=(5.2 * max(1, len(models)), 8.4), squeeze=False)
    device = data.get("machine", {}).get("gpu") or data.get("settings", {}).get("device", "cpu").upper()
    fig.suptitle(f"Causal-LM quality race ({device}):\nvalidation loss vs tokens and vs training seconds", fontsize=11)
    for column, (model, entry) in enumerate(models.items()):
        for row, (axis, label) in enumerate((("tokens", "tokens seen"), ("seconds", "training seconds"))):
            ax = axes[row][column]
            for name, result in entry["systems"].items():
                curve = [p for p in result["curve"] if axis in p]
                lr = f", lr {result['lr']:g}" if result.get("lr") else ""
                ax.plot([p[axis] for p in curve], [p["val_loss"] for p in curve], marker="o", markersize=3,
                        label=f"{name} ({result['parameters'] / 1e6:.2f}M{lr})")
            budget = entry.get("summary", {}).get("budget_seconds")
            if budget and axis == "seconds":
                ax.axvline(budget, color="gray", linestyle=":", linewidth=1, label="CoMERA's seconds")
            ax.set_title(model, fontsize=10)
            ax.set_xlabel(label)
            ax.set_ylabel("validation loss (nats/token)")
            ax.legend(fontsize=7)
    return _save(fig, path)


def draw_all(quick: bool) -> list[Path]:
    """Redraw every chart whose JSON exists for ``quick`` (or full) mode; the PNGs written."""
    suffix = "_quick" if quick else ""
    written = []
    for stem, draw in (("optimizer_memory", plot_optimizers), ("dlrm_memory", plot_dlrm)):
        source = RESULTS / f"{stem}{suffix}.json"
        if source.exists():
            written.append(draw(json.loads(source.read_text()), source.with_suffix(".png")))
    summary = RESULTS / f"summary{suffix}.json"
    if summary.exists():
        compression = json.loads(summary.read_text())["parts"].get("compression")
        if compression:
            written.append(plot_compression(compression, RESULTS / f"compression{suffix}.png"))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="draw the *_quick.json results")
    for path in draw_all(parser.parse_args().quick):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
