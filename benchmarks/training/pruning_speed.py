"""Does rank pruning really make training cheaper? An encoder trained with ComeraCallback.

Trains a post-LN encoder with the paper's layer widths (768 / 3072, rank 30; fewer layers) on
the clothing-review sentence pairs (real data, offline) with a short step-based CoMERA schedule,
records the compression per epoch and per prune event, then times one full training step
(forward, backward, AdamW step) of the unpruned full-rank copy and of the pruned model on the
same batch, interleaved in one process, and writes the PNG of the compression curve. The
schedule is deliberately aggressive (a speed measurement, not a quality one).

    python -m benchmarks.training.pruning_speed [--layers 2] [--out benchmarks/results/pruning_speed.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger

from comera_lightning import ComeraCallback
from comera_lightning.cli.plot import plot_compression, read_metrics
from comera_lightning.data import SentencePairDataModule
from comera_lightning.models.transformer import SentencePairClassifier
from comera_lightning.rank import compression_stats, tt_layers


class KeepFullRankCopy(L.Callback):
    """Snapshots the tensorized model before the first training step (full rank, for timing).

    Only its ``forward`` is used: the copy shares the callback's wrapped ``training_step``.
    """

    def __init__(self) -> None:
        self.copy = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.copy = copy.deepcopy(pl_module)


def step_time(model: torch.nn.Module, batch: dict, reps: int) -> list[float]:
    """Seconds of forward + backward + AdamW step on ``batch``, ``reps`` times."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        optimizer.zero_grad()
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        torch.nn.functional.cross_entropy(logits, batch["labels"]).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-ff", type=int, default=3072)
    parser.add_argument("--max-rank", type=int, default=30)
    parser.add_argument("--early-steps", type=int, default=40)
    parser.add_argument("--late-steps", type=int, default=80)
    parser.add_argument("--train-samples", type=int, default=4000)
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--out", default="benchmarks/results/pruning_speed.json")
    args = parser.parse_args()
    L.seed_everything(0)

    data = SentencePairDataModule(batch_size=32, max_length=128, vocab_size=4096, limit_train_samples=args.train_samples, limit_eval_samples=300)
    model = SentencePairClassifier(
        vocab_size=data.vocab_size, d_model=args.d_model, num_layers=args.layers, num_heads=12, d_ff=args.d_ff,
        max_positions=128, num_classes=data.num_classes, lr_cores=1e-3, lr_other=5e-4,
    )
    comera = ComeraCallback(
        max_rank=args.max_rank, early_steps=args.early_steps, late_steps=args.late_steps, prune_every_n_steps=20,
        target_ratio=0.2, rank_weight=0.05, gate_lr=2e-2,
    )
    snapshot = KeepFullRankCopy()
    logger = CSVLogger("outputs/benchmarks", name="pruning_speed")
    trainer = L.Trainer(
        max_steps=args.early_steps + args.late_steps, callbacks=[comera, snapshot], logger=logger, log_every_n_steps=5,
        accelerator="cpu", val_check_interval=20, limit_val_batches=5,
    )
    trainer.fit(model, datamodule=data)
    test = trainer.test(model, datamodule=data, verbose=False)[0]

    batch = next(iter(data.train_dataloader()))
    full, pruned = snapshot.copy, model
    timings = {"full_rank": [], "pruned": []}
    for _ in range(2):  # interleave so background load hits both alike
        timings["full_rank"] += step_time(full, batch, args.reps // 2)
        timings["pruned"] += step_time(pruned, batch, args.reps // 2)
    medians = {k: statistics.median(v[2:]) for k, v in timings.items()}

    series = read_metrics(Path(logger.log_dir) / "metrics.csv")
    stored = dict(series.get("comera/compression_tt", []))
    by_step = {step: {"active": round(ratio, 1), "stored": round(stored.get(step, float("nan")), 1)}
               for step, ratio in series.get("comera/compression_tt_active", [])[::4]}
    png = plot_compression(Path(logger.log_dir) / "metrics.csv")
    result = {
        "test_accuracy": test.get("test/acc"),
        "compression_tt_by_step": by_step,
        "final": {**compression_stats(model).__dict__, "tt_compression": compression_stats(model).tt_compression,
                  "model_compression": compression_stats(model).model_compression},
        "ranks": {name: list(layer.physical_ranks) for name, layer in tt_layers(model)},
        "step_ms": {k: v * 1e3 for k, v in medians.items()},
        "speedup_pruned_vs_full_rank": medians["full_rank"] / medians["pruned"],
        "torch_threads": torch.get_num_threads(),
        "png": str(png),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "ranks"}, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
