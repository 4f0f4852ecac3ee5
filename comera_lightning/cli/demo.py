"""``make demo``: train the tiny Transformer config with CoMERA on CPU (fit, then test) and print a summary.

    python -m comera_lightning.cli.demo                                  # the bundled transformer_tiny config
    python -m comera_lightning.cli.demo --dense true                     # the same model, dense (no CoMERA)
    python -m comera_lightning.cli.demo --config other.yaml --trainer.max_epochs 2

Every argument except ``--threads`` goes to :class:`~comera_lightning.cli.app.ComeraCLI` (as for
``comera-lightning fit``); the test runs on the final (pruned) weights.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from comera_lightning.cli.app import ComeraCLI, finish_wandb, write_compression_plot
from comera_lightning.cli.config_files import CONFIG_DIR
from comera_lightning.cli.wandb_run import upload_fit_images, write_summary
from comera_lightning.rank import compression_stats, tt_layers

CONFIG = CONFIG_DIR / "transformer_tiny.yaml"


def run(cli_args: Sequence[str]) -> dict[str, Any]:
    """Fit then test through the CLI machinery; return the numbers and paths of the summary."""
    start = time.perf_counter()
    args = list(cli_args)
    if not any(a in ("-c", "--config") or a.startswith("--config=") for a in args):
        args = ["--config", str(CONFIG), *args]
    cli = ComeraCLI(args=args, run=False)
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    trainer.fit(model, datamodule=data)
    val_acc = _float(trainer.callback_metrics.get("val/acc"))
    png = write_compression_plot(trainer)
    upload_fit_images(trainer, png)
    tested = trainer.test(model, datamodule=data)[0]
    write_summary(trainer, tested)
    stats = compression_stats(model)
    layers = tt_layers(model)
    encoder = getattr(getattr(model, "backbone", None), "encoder", None)
    summary: dict[str, Any] = {
        "test_acc": tested.get("test/acc"),
        "test_metrics": {k: float(v) for k, v in tested.items()},
        "val_acc": val_acc,
        "encoder_compression": compression_stats(encoder).model_compression if encoder is not None else None,
        "model_compression": stats.model_compression,
        "tt_compression": stats.tt_compression,
        "params": stats.model_parameters,
        "dense_params": stats.dense_model_parameters,
        "tt_params": stats.tt_parameters,
        "dense_tt_params": stats.dense_tt_parameters,
        "csv_dir": next((lg.log_dir for lg in trainer.loggers if isinstance(lg, CSVLogger)), None),
        "wandb_dir": _wandb_dir(trainer),
        "png": png,
        "tt_layers": len(layers),
        "rank0_layers": [name for name, layer in layers if 0 in layer.ranks],
    }
    if hasattr(data, "class_counts"):
        counts = data.class_counts("test")
        summary["test_majority"] = max(counts.values()) / sum(counts.values())
        summary["val_majority"] = data.majority_rate
    finish_wandb(trainer)
    summary["wall_s"] = time.perf_counter() - start
    return summary


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _wandb_dir(trainer: Any) -> str | None:
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger) and lg._experiment is not None and getattr(lg._experiment, "dir", None):
            return str(Path(lg._experiment.dir).parent)
    return None


def format_summary(s: dict[str, Any]) -> str:
    """The demo's closing lines."""
    lines = ["", "=== CoMERA demo summary ==="]
    if s.get("test_acc") is not None:
        majority = f" (majority class: {s['test_majority']:.3f} test, {s['val_majority']:.3f} val)" if "test_majority" in s else ""
        lines.append(f"test accuracy            {s['test_acc']:.4f}{majority}")
    others = {k: v for k, v in s.get("test_metrics", {}).items() if k != "test/acc"}
    if others:
        lines.append("test metrics             " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(others.items())))
    if s.get("val_acc") is not None:
        lines.append(f"validation accuracy      {s['val_acc']:.4f} (last epoch)")
    if s["tt_params"]:
        lines += [
            f"compression, whole model {s['model_compression']:.1f}x  ({s['dense_params']:,} -> {s['params']:,} parameters)",
            f"compression, TT layers   {s['tt_compression']:.1f}x  ({s['dense_tt_params']:,} -> {s['tt_params']:,} parameters)",
        ]
        if s.get("rank0_layers"):
            lines.append(
                f"pruned to rank 0         {len(s['rank0_layers'])} of {s['tt_layers']} TT layers output their bias only: "
                + ", ".join(s["rank0_layers"])
            )
        if s.get("encoder_compression") is not None:
            lines.append(f"compression, encoder     {s['encoder_compression']:.1f}x  (all its parameters: cores, gates, biases, norms)")
    else:
        lines.append(f"dense model              {s['params']:,} parameters (no tensorized layers)")
    lines += [
        f"wall time                {s['wall_s']:.0f} s ({s['wall_s'] / 60:.1f} min, {torch.get_num_threads()} CPU thread(s))",
        f"CSV logs                 {s['csv_dir']}",
        f"W&B offline run          {s['wandb_dir'] or 'none (W&B disabled)'}",
        f"compression plot         {s['png'] or 'none'}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m comera_lightning.cli.demo``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument(
        "--threads", type=int, default=int(os.environ.get("COMERA_DEMO_THREADS", "1")),
        help="torch CPU threads (default 1: on a small shared CPU one thread is fastest for this tiny model)",
    )
    known, rest = parser.parse_known_args(argv)
    torch.set_num_threads(max(1, known.threads))
    summary = run(rest)
    print(format_summary(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
