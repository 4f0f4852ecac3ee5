"""Compression curves from a metrics.csv: the axis scale follows the range, and the ticks carry plain numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from comera_lightning.cli.plot import axis_scale, compression_figure, plot_compression

PLAIN = re.compile(r"^\d[\d,]*(\.\d+)?$")  # 2, 0.5, 12.5, 1,000: no 10^1, no 2×10^0, no 1e+03


def _write_csv(path: Path, steps: list[int], ratios: list[float], losses: list[float]) -> Path:
    lines = ["step,comera/compression_tt,comera/compression_model,comera/stage,train/loss_step"]
    for i, (step, ratio, loss) in enumerate(zip(steps, ratios, losses)):
        stage = 0 if i < len(steps) // 2 else 1
        lines.append(f"{step},{ratio},{1 + (ratio - 1) / 2},{stage},{loss}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _visible_labels(axis) -> list[str]:
    axis.figure.canvas.draw()
    low, high = axis.get_ylim()
    return [label.get_text() for tick, label in zip(axis.get_yticks(), axis.get_yticklabels()) if low <= tick <= high]


def test_scale_is_linear_below_a_factor_of_ten_and_log_from_it() -> None:
    assert axis_scale([3.0, 9.9]) == "linear" and axis_scale([3.0, 30.0]) == "log"
    assert axis_scale([0.0, 50.0]) == "linear", "log needs positive values"
    assert axis_scale([2.0, float("nan"), 2.5]) == "linear"


@pytest.mark.parametrize("run, scale", [("two_epochs", "linear"), ("long", "log")])
def test_both_axes_carry_at_least_two_plain_labels(run: str, scale: str, tmp_path: Path) -> None:
    if run == "two_epochs":  # 2 epochs, logged every 10 steps: 3.1x to 8.7x
        csv = _write_csv(tmp_path / "metrics.csv", [9, 19, 29, 39, 49], [3.1, 3.4, 5.2, 7.9, 8.7], [1.1, 0.9, 0.8, 0.85, 0.7])
    else:  # 2,000 steps from 1.2x to 250x, the loss from 9 to 0.4
        steps = list(range(0, 2000, 10))
        csv = _write_csv(tmp_path / "metrics.csv", steps, [1.2 * (250 / 1.2) ** (s / 1990) for s in steps],
                         [9 * (0.4 / 9) ** (s / 1990) for s in steps])
    fig = compression_figure(csv)
    ratios, losses = fig.axes[:2]
    assert ratios.get_yscale() == scale and losses.get_yscale() == scale
    for axis in (ratios, losses):
        labels = _visible_labels(axis)
        assert len(labels) >= 2 and all(PLAIN.match(text) for text in labels), labels
    assert plot_compression(csv).is_file()
