"""What the classifier and DLRM compress benchmarks share (``compress_pairs``, ``compress_dlrm``): the command line
recorded, every system's runs from the trained weights, and the markdown table written beside the JSON."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import lightning as L

from benchmarks.probes import RESULTS, without_out, write_result

Cell = Callable[[dict[str, Any], dict[str, Any]], str]


def markdown(out: dict[str, Any], systems: tuple[str, ...], heading: str, dense_text: str, cell: Cell, footer: str) -> str:
    """A row per compression, a column per system of ``systems`` that ran (``cell(run, dense)`` each), under the
    command and the trained dense model (``dense_text``, then the dense model given the extra steps, if it ran)."""
    dense = out["dense"]
    lines = [f"{heading} ({out['machine']['cpu']}, {out['date']}): `{out['command']}`", "",
             dense_text + (f"; dense + {out['extra_steps']} extra steps: {cell(out['dense_ft'], dense)}"
                           if "dense_ft" in out else ""),
             ""]
    shown = [s for s in systems if s != "dense_ft" and s in out["systems"] + ["comera"]]
    lines += ["| compression | " + " | ".join(shown) + " |", "|---|" + "---|" * len(shown)]
    for compression, results in out["by_compression"].items():
        lines.append(f"| {compression}× | " + " | ".join(cell(results[s], dense) for s in shown) + " |")
    return "\n".join(lines) + f"\n\n{footer}\n"


def recorded_command(module: str, argv: list[str] | None) -> str:
    """The command that ran, without ``--out`` and ``--cache`` and their paths (no local path in a results JSON)."""
    given = without_out(argv)
    kept = [a for i, a in enumerate(given) if not a.startswith("--cache") and (i == 0 or given[i - 1] != "--cache")]
    return " ".join([f"python -m {module}", *kept])


def run_systems(out: dict[str, Any], args: argparse.Namespace, systems: list[str], trained: Callable, fit: Callable,
                compress_at: Callable, table: Callable[[dict[str, Any]], str], default_name: str,
                serve: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Into ``out``: the trained dense model (``trained()``: weights, result; with ``serve``, its served program:
    ``serve(weights)``), the dense model given the extra steps (``fit``) when ``dense_ft`` is asked for, every
    compression's systems (``compress_at(state, compression)``); then the JSON and its table written (``--out``, else
    ``benchmarks/results/<default_name>``)."""
    state, out["dense"] = trained()
    if serve is not None:  # timed here, trained now or taken from the cache alike
        out["dense"] = {**out["dense"], "served": serve(state)}
    if "dense_ft" in systems:
        out["dense_ft"], _ = fit("dense_ft", out["extra_steps"], state)
    out["by_compression"] = {f"{c:g}": compress_at(state, c) for c in (float(c) for c in args.compressions.split(",") if c)}
    write_result(args.out or RESULTS / default_name, out, table(out))
    return out


def quiet_fit(model: L.LightningModule, data: L.LightningDataModule, steps: int, callbacks: list[Any],
              limit: int | None) -> tuple[L.Trainer, float]:
    """A quiet Trainer of ``steps`` (at least 1, so that it can evaluate; ``limit`` batches per epoch and per
    evaluation) that fits ``model`` when ``steps``: (the trainer, the fit's seconds)."""
    trainer = L.Trainer(max_steps=max(steps, 1), callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_train_batches=limit, limit_val_batches=limit, limit_test_batches=limit)
    started = time.perf_counter()
    if steps:
        trainer.fit(model, datamodule=data)
    return trainer, time.perf_counter() - started
