"""What a CLI run sends to W&B besides the step metrics: the nested config, images and summary numbers.

* :class:`ComeraWandbLogger` sends the CLI's full resolved config, nested as in the YAML (``model``,
  ``data``, ``trainer``, ``comera`` (the callback), ``seed_everything``), in place of Lightning's flat
  merge of the model's and data module's hyper-parameters (which held keys twice).
* :func:`upload_fit_images` uploads ``compression.png`` and a per-layer rank heatmap.
* :func:`write_summary` sets ``final/*`` summary numbers: compression and each test metric.

The ``comera/*`` step metrics are plain ``log_metrics`` calls, so W&B draws them as its native line charts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn

from comera_lightning.rank import compression_stats, tt_layers

__all__ = ["ComeraWandbLogger", "draw_rank_heatmap", "upload_fit_images", "wandb_loggers", "write_summary"]


class ComeraWandbLogger(WandbLogger):
    """A WandbLogger that logs ``run_config`` (nested) instead of the flat hyper-parameters Lightning hands it."""

    def __init__(self, *args: Any, run_config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_config = dict(run_config) if run_config is not None else None

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        if self.run_config is None:
            super().log_hyperparams(params)
        else:
            self.experiment.config.update(self.run_config, allow_val_change=True)


def wandb_loggers(trainer: Trainer) -> list[WandbLogger]:
    """The W&B loggers of ``trainer`` (none on ranks other than 0: they do not log)."""
    return [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)] if trainer.is_global_zero else []


def draw_rank_heatmap(module: nn.Module, out: str | Path) -> Path | None:
    """A PNG of every TT layer's active bond ranks (rows: layers, columns: bonds); None if there is no TT layer."""
    layers = tt_layers(module)
    if not layers:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ranks = [layer.ranks for _, layer in layers]
    width = max(len(r) for r in ranks)
    grid = np.full((len(ranks), width), np.nan)
    for row, bonds in enumerate(ranks):
        grid[row, : len(bonds)] = bonds
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * width, 0.8 + 0.32 * len(ranks)))
    image = ax.imshow(grid, aspect="auto", cmap="viridis")
    for (row, col), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(col, row, f"{int(value)}", ha="center", va="center", color="w" if value < np.nanmax(grid) / 2 else "k", fontsize=8)
    ax.set_yticks(range(len(layers)), [name for name, _ in layers], fontsize=8)
    ax.set_xticks(range(width), [f"bond {k}" for k in range(width)], fontsize=8)
    ax.set_title("active TT ranks (0: the layer outputs its bias only)", fontsize=9)
    fig.colorbar(image, ax=ax, label="rank")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def upload_fit_images(trainer: Trainer, compression_png: Path | None) -> Path | None:
    """Draw the rank heatmap beside ``compression_png`` and upload both to every W&B logger; the heatmap's path."""
    module = trainer.lightning_module
    heatmap = None
    if compression_png is not None and module is not None and trainer.is_global_zero:
        heatmap = draw_rank_heatmap(module, Path(compression_png).with_name("ranks.png"))
    for lg in wandb_loggers(trainer):
        for key, path in (("comera/compression_plot", compression_png), ("comera/rank_heatmap", heatmap)):
            if path is not None:
                lg.log_image(key=key, images=[str(path)], step=trainer.global_step)
    return heatmap


def write_summary(trainer: Trainer, test_metrics: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Set ``final/compression_*`` and ``final/<test metric>`` in every W&B run's summary; returns them."""
    summary: dict[str, float] = {}
    module = trainer.lightning_module
    if module is not None and tt_layers(module):
        stats = compression_stats(module)
        summary = {"final/compression_model": stats.model_compression, "final/compression_tt": stats.tt_compression}
    for key, value in (test_metrics or {}).items():
        summary[f"final/{key}"] = float(value)
    for lg in wandb_loggers(trainer):
        lg.experiment.summary.update(summary)
    return summary
