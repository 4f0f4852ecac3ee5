"""The frontier on the sentence-pair Transformer (issue #43): adaptive ranks against fixed ranks of the same size and a
narrow dense model, at several size budgets, on the clothing-review pairs (``make demo``'s data and model shape).

At each budget (the tensorized layers ``c`` times smaller than dense), side by side in one process with the same data,
seed, epochs and optimizer: ``comera`` (``ComeraCallback(budget=BudgetConfig(compression=c))``, the package's defaults:
it starts at twice the size asked and the late stage cuts the least important ranks), ``fixed`` (the same layers at
uniform ranks of the size asked the whole time, ``adapt=False``) and ``narrow`` (a dense model whose width, a multiple
of the head count, gives the adaptive run's parameter count); ``dense`` once. Reports test accuracy, the last
validation loss and the whole model's parameters; writes JSON and prints a markdown table.

    python -m benchmarks.quality.pairs_frontier [--budgets 2,4,8,16] [--epochs 4] [--seed 0] [--systems comera,fixed]
        [--cut svd] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.probes import RESULTS, machine_basics, without_out
from benchmarks.quality.settings import systems_of
from comera_lightning import BudgetConfig, ComeraCallback
from comera_lightning.data.pairs import SentencePairDataModule
from comera_lightning.models.transformer import SentencePairClassifier
from comera_lightning.schedule.config import BUDGET_CUTS

#: ``make demo``'s model (configs/transformer_tiny.yaml) in the package's layout: the callback decides what to tensorize.
MODEL = {"d_model": 64, "num_layers": 2, "num_heads": 4, "d_ff": 256, "dropout": 0.1, "max_positions": 64,
         "lr_cores": 1e-3, "lr_other": 1e-3}
DATA = {"source": "clothing_reviews", "batch_size": 32, "eval_batch_size": 256, "max_length": 64,
        "bucket_by_length": True, "vocab_size": 8192}
SYSTEMS = ("dense", "comera", "fixed", "narrow")
NEEDS = {"narrow": ("comera",)}  # narrow takes its width from the comera run's parameters


def _model(data: SentencePairDataModule, d_model: int = MODEL["d_model"]) -> SentencePairClassifier:
    shape = {**MODEL, "d_model": d_model, "d_ff": 4 * d_model}
    return SentencePairClassifier(vocab_size=data.vocab_size, num_classes=data.num_classes, **shape)


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fit(system: str, data: SentencePairDataModule, args: argparse.Namespace, *, budget: BudgetConfig | None = None,
        d_model: int = MODEL["d_model"], limit: int | None = None) -> dict[str, Any]:
    """One run: train for ``args.epochs`` epochs, test the final weights."""
    L.seed_everything(args.seed, verbose=False)
    model = _model(data, d_model)
    callbacks = [ComeraCallback(budget=budget)] if budget is not None else []
    trainer = L.Trainer(max_epochs=args.epochs, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_train_batches=limit, limit_val_batches=limit, limit_test_batches=limit)
    started = time.perf_counter()
    trainer.fit(model, datamodule=data)
    seconds = time.perf_counter() - started
    validation = float(trainer.callback_metrics["val/loss"])
    tested = trainer.test(model, datamodule=data, verbose=False)[0]
    result = {"system": system, "d_model": d_model, "parameters": _parameters(model), "val_loss": round(validation, 4),
              "test_acc": round(float(tested["test/acc"]), 4), "seconds": round(seconds, 1)}
    print(f"  {system:7s} d_model {d_model:3d} parameters {result['parameters']:9,} val loss {validation:.4f} "
          f"test acc {result['test_acc']:.4f}", file=sys.stderr, flush=True)
    return result


def narrow_d_model(data: SentencePairDataModule, target: int) -> int:
    """The width (a multiple of the head count, below the full one) whose dense model is nearest ``target`` parameters."""
    from benchmarks.quality.pair_models import PAIR_MODELS  # it builds on this module's MODEL

    return PAIR_MODELS["transformer"].narrow_width(data, target)


def markdown(result: dict[str, Any]) -> str:
    dense = result.get("dense")
    names = {"comera": "CoMERA, adaptive ranks", "fixed": "fixed ranks", "narrow": "narrow dense"}
    shown = [s for s in names if s in result.get("systems", SYSTEMS)]
    dense_cell = f" (dense: {dense['test_acc']:.4f}, {dense['parameters']:,}) |" if dense else ""
    lines = [f"Sentence-pair Transformer ({result['machine']['cpu']}, {result['date']}): `{result['command']}`", "",
             "| budget | " + " | ".join(names[s] for s in shown) + " |" + dense_cell,
             "|---" * (len(shown) + 1 + bool(dense)) + "|"]
    for budget, runs in result["budgets"].items():
        cells = [f"{runs[s]['test_acc']:.4f}, {runs[s]['val_loss']:.4f} ({runs[s]['parameters']:,})" for s in shown]
        lines.append(f"| {budget}× | " + " | ".join(cells) + " |" + (" |" if dense else ""))
    return "\n".join(lines) + ("\n\nTest accuracy, validation loss (the whole model's parameters); narrow: dense at a "
                               "smaller d_model.\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="2,4,8,16", help="compressions asked of the tensorized layers, comma-separated")
    parser.add_argument("--epochs", type=int, default=4, help="make demo's 4 (the default stages: 2 early, 2 late)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"which of {','.join(SYSTEMS)} to run, comma-separated")
    parser.add_argument("--cut", choices=BUDGET_CUTS, default="gates", help="BudgetConfig.cut of the adaptive runs")
    parser.add_argument("--limit-batches", type=int, default=None, help="batches per epoch and per evaluation (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/pairs_frontier.json)")
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",") if b]
    systems = systems_of(parser, args.systems, SYSTEMS, NEEDS)
    torch.set_num_threads(1)
    data = SentencePairDataModule(**DATA, seed=args.seed)
    data.prepare_data()
    data.setup("fit")
    result: dict[str, Any] = {"command": "python -m benchmarks.quality.pairs_frontier " + " ".join(without_out(argv)),
                              "date": datetime.date.today().isoformat(), "machine": machine_basics(),
                              "model": MODEL, "epochs": args.epochs, "seed": args.seed, "systems": systems,
                              "cut": args.cut, "budgets": {}}
    if "dense" in systems:
        result["dense"] = fit("dense", data, args, limit=args.limit_batches)
    for compression in budgets:
        runs = {}
        if "comera" in systems:
            runs["comera"] = fit("comera", data, args, budget=BudgetConfig(compression=compression, cut=args.cut),
                                 limit=args.limit_batches)
        if "fixed" in systems:
            runs["fixed"] = fit("fixed", data, args, budget=BudgetConfig(compression=compression, adapt=False),
                                limit=args.limit_batches)
        if "narrow" in systems:
            runs["narrow"] = fit("narrow", data, args, d_model=narrow_d_model(data, runs["comera"]["parameters"]),
                                 limit=args.limit_batches)
        result["budgets"][f"{compression:g}"] = runs
    out = args.out or RESULTS / "pairs_frontier.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    print(f"wrote {out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
