"""Turn a run's ``metrics.csv`` (Lightning's CSVLogger) into a PNG of the compression curve.

    python -m comera_lightning.cli.plot logs/transformer_tiny/version_0/metrics.csv [-o compression.png]
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path

__all__ = ["read_metrics", "plot_compression"]

STAGE_NAMES = ("early", "late", "final")


def read_metrics(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Columns of a CSVLogger ``metrics.csv`` as ``{name: [(step, value), ...]}`` (empty cells dropped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass the metrics.csv written by Lightning's CSVLogger.")
    series: dict[str, list[tuple[int, float]]] = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or "step" not in reader.fieldnames:
            raise ValueError(f"{path} has no 'step' column; expected a CSVLogger metrics.csv.")
        for line, row in enumerate(reader, start=2):
            try:
                step = int(float(row["step"]))
            except (TypeError, ValueError):
                raise ValueError(f"{path}, line {line}: step {row['step']!r} is not a number.") from None
            for key, value in row.items():
                if key != "step" and value not in ("", None):
                    series.setdefault(key, []).append((step, float(value)))
    return series


def _first(series: dict, names: Sequence[str]) -> str | None:
    return next((n for n in names if n in series), None)


def plot_compression(metrics_csv: str | Path, out: str | Path | None = None, title: str | None = None) -> Path:
    """Draw compression ratios (log scale) and losses against steps, shading the stages; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(metrics_csv)
    ratio_keys = [k for k in ("comera/compression_tt_active", "comera/compression_tt", "comera/compression_model") if k in series]
    if not ratio_keys:
        raise ValueError(
            f"{metrics_csv} holds no comera/compression_* values: ComeraCallback was not on the Trainer, "
            "or no step was logged yet (trainer.log_every_n_steps)."
        )
    out = Path(out) if out is not None else Path(metrics_csv).with_name("compression.png")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    labels = {
        "comera/compression_tt_active": "tensorized layers (active ranks)",
        "comera/compression_tt": "tensorized layers (stored)",
        "comera/compression_model": "whole model",
    }
    for key in ratio_keys:
        steps, values = zip(*series[key])
        top.plot(steps, values, label=labels[key])
    top.set_yscale("log")
    top.set_ylabel("compression ratio (dense / TT params)")
    top.grid(True, which="both", alpha=0.3)
    top.legend(loc="center left")
    if "comera/stage" in series:
        _shade_stages(top, series["comera/stage"])
    loss_keys = [k for k in series if "loss" in k and not k.startswith("comera/")]
    loss_keys += [k for k in ("comera/task_loss",) if k in series and not any(k2.startswith("train") for k2 in loss_keys)]
    for key in sorted(loss_keys):
        steps, values = zip(*series[key])
        finite = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
        if finite:
            bottom.plot(*zip(*finite), marker="o" if len(finite) < 40 else None, label=key)
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    bottom.grid(True, alpha=0.3)
    if loss_keys:
        bottom.legend(loc="upper right")
    fig.suptitle(title or f"CoMERA compression — {Path(metrics_csv).parent.name}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _shade_stages(axis, stage_points: list[tuple[int, float]]) -> None:
    colours = ("#dceefc", "#fde7d4", "#e3f6e0")
    spans: list[tuple[int, int, int]] = []
    for step, value in stage_points:
        stage = int(value)
        if spans and spans[-1][2] == stage:
            spans[-1] = (spans[-1][0], step, stage)
        else:
            spans.append((step, step, stage))
    for start, end, stage in spans:
        axis.axvspan(start, end, color=colours[stage % 3], alpha=0.6, lw=0)
        axis.text(start, 1.0, f" {STAGE_NAMES[stage % 3]}", transform=axis.get_xaxis_transform(), va="top", fontsize=8)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: ``python -m comera_lightning.cli.plot metrics.csv -o out.png``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics_csv")
    parser.add_argument("-o", "--out", default=None)
    args = parser.parse_args(argv)
    print(plot_compression(args.metrics_csv, args.out))


if __name__ == "__main__":
    main()
