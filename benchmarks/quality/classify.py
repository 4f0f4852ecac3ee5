r"""The classifier race: a Hugging Face sequence classifier on a real labelled dataset, dense against CoMERA, at each LR.

Random-init ``LlamaForSequenceClassification`` (a decoder) and ``BertForSequenceClassification`` (an encoder)
learn the clothing-reviews sentence pairs the package ships (title, review -> negative / neutral / positive;
``SentencePairDataModule``) inside one plain LightningModule with one AdamW and a warm-up + cosine schedule,
validated ``--evals`` times (the first at 10 % of training). Per model and peak LR: ``dense`` and ``comera``
(``ComeraCallback()`` with its defaults, plus ``--comera key=value``). Reported: the validation loss and accuracy
at every validation, the loss of always predicting the training classes' frequencies ("chance"), whether a run
was still at chance at its first validation, and the final figures.

    python -m benchmarks.quality.classify --quick
    python -m benchmarks.quality.classify --models llama:128:2,bert:128:2 --lrs 3e-4,1e-3,3e-3
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.probes import RESULTS, machine_basics, without_out
from benchmarks.quality.lm import warmup_cosine
from benchmarks.quality.settings import _numbers, _options

FAMILIES = ("llama", "bert")


def build_classifier(family: str, width: int, layers: int, vocab: int, labels: int, pad: int, length: int) -> torch.nn.Module:
    """A random-init Hugging Face sequence classifier (no download): 4 heads, MLP 4x, untied."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=4,
                  intermediate_size=4 * width, max_position_embeddings=length, num_labels=labels, pad_token_id=pad)
    if family == "llama":
        return tf.LlamaForSequenceClassification(tf.LlamaConfig(num_key_value_heads=4, tie_word_embeddings=False, **common))
    if family == "bert":
        return tf.BertForSequenceClassification(tf.BertConfig(**common))
    raise ValueError(f"unknown classifier family {family!r}; choose one of {FAMILIES}")


class PairClassifier(L.LightningModule):
    """What a user writes: the model built in ``configure_model``, one AdamW, warm-up + cosine."""

    def __init__(self, build: Any, lr: float, warmup: float = 0.1, min_lr: float = 0.1, weight_decay: float = 0.01) -> None:
        super().__init__()
        self.build, self.lr, self.warmup, self.min_lr, self.weight_decay = build, lr, warmup, min_lr, weight_decay
        self.model: torch.nn.Module | None = None

    def configure_model(self) -> None:
        if self.model is None:
            self.model = self.build()

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"].long(), "labels": batch["labels"]}
        if "token_type_ids" in batch and "Bert" in type(self.model).__name__:
            inputs["token_type_ids"] = batch["token_type_ids"]
        return self.model(**inputs)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch).loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self(batch)
        size = batch["labels"].shape[0]
        self.log("val/loss", out.loss, batch_size=size)
        self.log("val/acc", (out.logits.argmax(-1) == batch["labels"]).float().mean(), batch_size=size)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        return warmup_cosine(optimizer, self.trainer.estimated_stepping_batches, self.warmup, self.min_lr)


class Points(L.Callback):
    """Validation loss and accuracy after every validation, with the step."""

    def __init__(self) -> None:
        self.points: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = trainer.callback_metrics
            self.points.append({"step": trainer.global_step, "val_loss": round(float(metrics["val/loss"]), 4),
                                "val_acc": round(float(metrics["val/acc"]), 4)})


def chance_loss(data: Any) -> float:
    """Cross-entropy of always predicting the training split's class frequencies."""
    counts = [c for c in data.class_counts("train").values() if c]
    total = sum(counts)
    return -sum(c / total * math.log(c / total) for c in counts)


def run(system: str, spec: str, lr: float, args: argparse.Namespace, data: Any) -> dict[str, Any]:
    """Train one classifier; its validation points, parameters and seconds."""
    from comera_lightning import ComeraCallback
    from comera_lightning.rank import compression_stats

    family, width, layers = spec.split(":")
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    build = lambda: build_classifier(family, int(width), int(layers), data.vocab_size, data.num_classes,  # noqa: E731
                                     data.pad_token_id, data.max_length)
    module, points = PairClassifier(build, lr), Points()
    callbacks = [points] + ([ComeraCallback(**_options(args.comera))] if system == "comera" else [])
    trainer = L.Trainer(max_epochs=args.evals, limit_train_batches=args.steps // args.evals, limit_val_batches=args.val_batches,
                        num_sanity_val_steps=0, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    result = {"system": system, "model": spec, "lr": lr, "steps": trainer.global_step, "curve": points.points,
              "parameters": sum(p.numel() for p in module.parameters()),
              "tt_parameters": compression_stats(module).tt_parameters, "seconds": round(time.perf_counter() - started, 1)}
    print(f"{spec} {system:7s} lr {lr:g}: val loss " + " ".join(f"{p['val_loss']:.3f}" for p in points.points)
          + f"  acc {points.points[-1]['val_acc']:.3f}", file=sys.stderr, flush=True)
    return result


def summary_table(results: dict[str, Any]) -> str:
    """One row per (model, LR, system): loss at the first validation (10 %), final loss and accuracy."""
    chance = results["chance_loss"]
    lines = [f"| model | lr | system | val loss at 10 % (chance {chance:.3f}) | final val loss (vs dense) | final acc | parameters |",
             "|---|---|---|---|---|---|---|"]
    for model, by_lr in results["models"].items():
        for lr, systems in by_lr.items():
            dense = systems.get("dense", {}).get("curve", [{}])[-1].get("val_loss")
            for name, result in systems.items():
                first, last = result["curve"][0], result["curve"][-1]
                stuck = " (at chance)" if first["val_loss"] >= chance else ""
                versus = f" ({100 * (last['val_loss'] / dense - 1):+.1f} %)" if dense else ""
                lines.append(f"| {model} | {lr} | {name} | {first['val_loss']:.3f}{stuck} | {last['val_loss']:.3f}{versus} | "
                             f"{last['val_acc']:.3f} | {result['parameters']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama:128:2,bert:128:2", help="family:width:layers, comma-separated")
    parser.add_argument("--lrs", default="3e-4,1e-3,3e-3", help="peak LRs, comma-separated")
    parser.add_argument("--systems", default="dense,comera")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--evals", type=int, default=10, help="validations (the first at steps / evals)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--val-batches", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="llama:64:1, one LR, 20 steps")
    parser.add_argument("--comera", nargs="*", default=[], help="ComeraCallback arguments, key=value (JSON values)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.lrs, args.steps, args.evals, args.val_batches = "llama:64:1", "1e-3", 20, 2, 2
    from comera_lightning.data import SentencePairDataModule

    data = SentencePairDataModule(batch_size=args.batch_size, max_length=64 if args.quick else 128, vocab_size=4096)
    data.prepare_data()
    data.setup("fit")
    results: dict[str, Any] = {"command": "python -m benchmarks.quality.classify " + " ".join(without_out(argv)),
                               "machine": machine_basics(), "chance_loss": round(chance_loss(data), 4),
                               "majority_rate": round(data.majority_rate, 4), "models": {}}
    for spec in args.models.split(","):
        results["models"][spec] = {f"{lr:g}": {system: run(system, spec, lr, args, data) for system in args.systems.split(",")}
                                   for lr in _numbers(args.lrs, float)}
    out = args.out or RESULTS / f"classify{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(summary_table(results))
    print(f"\nwrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
