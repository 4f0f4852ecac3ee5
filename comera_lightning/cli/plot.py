"""Turn a run's ``metrics.csv`` (Lightning's CSVLogger) into a PNG of the compression curve.

    python -m comera_lightning.cli.plot logs/transformer_tiny/version_0/metrics.csv [-o compression.png]

Each value axis is linear unless its values span a factor of 10 or more (then logarithmic), and its
ticks carry plain numbers (``2``, ``5``, ``10``, ``1,000``), so a 2-epoch run and a long one both read.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["axis_scale", "compression_figure", "plot_compression", "read_metrics"]

STAGE_NAMES = ("early", "late", "final")
#: A value axis becomes logarithmic when its largest value is at least this many times its smallest.
LOG_RANGE = 10.0


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
    """Draw compression ratios and losses against steps, shading the stages, to a PNG; returns its path."""
    import matplotlib.pyplot as plt

    fig = compression_figure(metrics_csv, title)
    out = Path(out) if out is not None else Path(metrics_csv).with_name("compression.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def compression_figure(metrics_csv: str | Path, title: str | None = None) -> Any:
    """The figure of :func:`plot_compression`: compression ratios on top, losses below (a matplotlib Figure)."""
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
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    labels = {
        "comera/compression_tt_active": "tensorized layers (active ranks)",
        "comera/compression_tt": "tensorized layers (stored)",
        "comera/compression_model": "whole model",
    }
    for key in ratio_keys:
        top.plot(*zip(*series[key]), label=labels[key])
    _readable_axis(top, [v for key in ratio_keys for _, v in series[key]])
    top.set_ylabel("compression ratio (dense / TT params)")
    top.grid(True, which="both", alpha=0.3)
    top.legend(loc="center left")
    if "comera/stage" in series:
        _shade_stages(top, series["comera/stage"])
    _plot_losses(bottom, series)
    fig.suptitle(title or f"CoMERA compression — {Path(metrics_csv).parent.name}")
    fig.tight_layout()
    return fig


def _plot_losses(axis: Any, series: dict[str, list[tuple[int, float]]]) -> None:
    loss_keys = [k for k in series if "loss" in k and not k.startswith("comera/")]
    loss_keys += [k for k in ("comera/task_loss",) if k in series and not any(k2.startswith("train") for k2 in loss_keys)]
    shown: list[float] = []
    for key in sorted(loss_keys):
        finite = [(s, v) for s, v in series[key] if math.isfinite(v)]
        if finite:
            axis.plot(*zip(*finite), marker="o" if len(finite) < 40 else None, label=key)
            shown += [v for _, v in finite]
    if shown:
        _readable_axis(axis, shown)
        axis.legend(loc="upper right")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.grid(True, alpha=0.3)


def axis_scale(values: Sequence[float]) -> str:
    """``"log"`` when the (positive) values span a factor of :data:`LOG_RANGE` or more, else ``"linear"``."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or min(finite) <= 0:
        return "linear"
    return "log" if max(finite) / min(finite) >= LOG_RANGE else "linear"


def _readable_axis(axis: Any, values: Sequence[float]) -> None:
    """The y axis linear or logarithmic by :func:`axis_scale`, with ticks labelled by plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    plain = FuncFormatter(lambda value, _: _plain_number(value))
    if axis_scale(values) == "log":
        axis.set_yscale("log")
        decades = math.log10(max(values) / min(v for v in values if v > 0))
        axis.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
        axis.yaxis.set_minor_formatter(NullFormatter())
    else:
        axis.yaxis.set_major_locator(MaxNLocator(nbins=6))
    axis.yaxis.set_major_formatter(plain)


def _plain_number(value: float) -> str:
    """``2``, ``0.5``, ``12.5``, ``1,000``: a tick label without exponents."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


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
