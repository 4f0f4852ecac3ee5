"""The quality race: causal-LM pre-training with CoMERA against what a user would do instead.

Random-init Hugging Face causal LMs (Llama- and GPT-2-style) learn next-token prediction on the
package's code corpus (the Python standard library, byte-level BPE) inside one plain
LightningModule with one ``AdamW`` and a warm-up + cosine schedule. Side by side, same data,
same steps, same seed:

* ``dense``: the model as configured;
* ``comera``: the same module with ``ComeraCallback()`` and its defaults (nothing else set);
* ``narrow``: a dense model of the same family whose width gives the parameter count CoMERA ends with;
* ``lowrank``: every layer CoMERA tensorizes replaced by a plain ``U·V`` factorisation whose rank
  gives CoMERA's final parameter count in those layers (no rank adaptation);
* ``galore``: the dense model trained with ``pytorch_optimizer.GaLore`` (low-rank gradient projection);
* ``dense_time``: the dense model given CoMERA's wall-clock instead of its steps (its own cosine
  schedule over the steps that fit in that time).

Reported per system: validation loss (nats per token) after every epoch with the training seconds
so far, the final validation loss, parameters at the end (whole model and the compressible
layers), the tensor peak of one training step, and the wall-clock. The plot draws validation loss
against seconds, one curve per system.

    python -m benchmarks.quality                              # the race (tens of minutes on 2 CPU cores)
    python -m benchmarks.quality --quick                      # one small model, fewer steps
    python -m benchmarks.quality --models llama:256:4 --systems dense,comera --comera gate_lr=0.01

Results go to ``benchmarks/results/quality[_quick].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning as L
import torch
from torch import nn

from comera_lightning import ComeraCallback, TensorizeConfig
from comera_lightning.data import CodeCorpusDataModule
from comera_lightning.rank import compression_stats

SYSTEMS = ("dense", "comera", "narrow", "lowrank", "galore", "dense_time")


# ---------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelSpec:
    """A Hugging Face causal LM: ``family`` (llama or gpt2), width, number of blocks."""

    family: str
    width: int
    layers: int

    @classmethod
    def parse(cls, text: str) -> "ModelSpec":
        family, width, layers = text.split(":")
        return cls(family, int(width), int(layers))

    def label(self) -> str:
        return f"{self.family}-{self.width}x{self.layers}"


def build_lm(spec: ModelSpec, vocab_size: int, block_size: int) -> nn.Module:
    """A random-init causal LM of ``spec`` (no download); heads of 64 dimensions, MLP 4× (Llama: 8/3×)."""
    import transformers as tf

    heads = max(1, spec.width // 64)
    if spec.family == "llama":
        intermediate = 64 * math.ceil(spec.width * 8 / 3 / 64)
        config = tf.LlamaConfig(vocab_size=vocab_size, hidden_size=spec.width, intermediate_size=intermediate,
                                num_hidden_layers=spec.layers, num_attention_heads=heads, num_key_value_heads=heads,
                                max_position_embeddings=block_size, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=1)
        return tf.LlamaForCausalLM(config)
    if spec.family == "gpt2":
        config = tf.GPT2Config(vocab_size=vocab_size, n_embd=spec.width, n_layer=spec.layers, n_head=heads,
                               n_positions=block_size, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)
        return tf.GPT2LMHeadModel(config)
    raise ValueError(f"unknown model family {spec.family!r}; use llama or gpt2")


class LowRankLinear(nn.Module):
    """``y = (x U) V + b``: a plain rank-``rank`` factorisation of a linear map (the low-rank baseline)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool, std: float) -> None:
        super().__init__()
        self.u = nn.Parameter(torch.randn(in_features, rank) * math.sqrt(std / math.sqrt(rank)))
        self.v = nn.Parameter(torch.randn(rank, out_features) * math.sqrt(std / math.sqrt(rank)))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x @ self.u) @ self.v
        return y + self.bias if self.bias is not None else y


def linear_like(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of an ``nn.Linear`` or a Hugging Face ``Conv1D``; None for anything else."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":
        return tuple(module.weight.shape)
    return None


def compressible_layers(model: nn.Module) -> list[str]:
    """The linear maps inside the transformer blocks (Llama ``model.layers.N``, GPT-2 ``transformer.h.N``)."""
    return [name for name, m in model.named_modules()
            if linear_like(m) is not None and (".layers." in f".{name}" or ".h." in f".{name}")]


def low_rank_(model: nn.Module, names: list[str], budget: int) -> int:
    """Replace ``names`` by ``LowRankLinear`` of one rank whose total parameters fit ``budget``; returns the rank."""
    shapes = {name: linear_like(model.get_submodule(name)) for name in names}
    per_rank = sum(i + o for i, o in shapes.values())
    rank = max(1, budget // per_rank)
    for name, (fan_in, fan_out) in shapes.items():
        old = model.get_submodule(name)
        std = float(old.weight.detach().float().std())
        new = LowRankLinear(fan_in, fan_out, rank, old.bias is not None, std)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
    return rank


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- the Lightning module
class CausalLM(L.LightningModule):
    """What a user writes: build the model in ``configure_model``, one AdamW, warm-up then cosine."""

    def __init__(self, spec: ModelSpec, vocab_size: int, block_size: int, lr: float = 1e-3, weight_decay: float = 0.0,
                 warmup: float = 0.05, low_rank_budget: int | None = None, galore_rank: int | None = None) -> None:
        super().__init__()
        self.spec, self.vocab_size, self.block_size = spec, vocab_size, block_size
        self.lr, self.weight_decay, self.warmup = lr, weight_decay, warmup
        self.low_rank_budget, self.galore_rank = low_rank_budget, galore_rank
        self.model: nn.Module | None = None
        self.low_rank: int | None = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = build_lm(self.spec, self.vocab_size, self.block_size)
        if self.low_rank_budget is not None:
            self.low_rank = low_rank_(self.model, compressible_layers(self.model), self.low_rank_budget)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.model(**batch).loss, batch_size=batch["input_ids"].shape[0])

    def configure_optimizers(self) -> dict[str, Any]:
        if self.galore_rank is not None:
            from pytorch_optimizer import GaLore

            names = set(compressible_layers(self.model))
            projected = [p for n, p in self.model.named_parameters() if p.dim() == 2 and n.rsplit(".", 1)[0] in names]
            ids = {id(p) for p in projected}
            rest = [p for p in self.parameters() if id(p) not in ids]
            groups = [{"params": rest},
                      {"params": projected, "rank": self.galore_rank, "update_proj_gap": 50, "scale": 0.25, "projection_type": "std"}]
            optimizer = GaLore(groups, lr=self.lr, weight_decay=self.weight_decay)
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = self.trainer.estimated_stepping_batches
        warmup = max(1, int(self.warmup * total))

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Curve(L.Callback):
    """Validation loss after every validation, with the training seconds spent so far (validation excluded)."""

    def __init__(self) -> None:
        self.points: list[dict[str, float]] = []
        self.train_seconds = 0.0
        self._started: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.train_seconds += time.perf_counter() - self._started

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.points.append({"step": trainer.global_step, "seconds": round(self.train_seconds, 2),
                                "val_loss": round(float(trainer.callback_metrics["val/loss"]), 4),
                                "parameters": parameters(pl_module)})


# ---------------------------------------------------------------------------- one run
@dataclass
class RaceSettings:
    """Data and schedule shared by every system of a race."""

    steps: int = 400
    epochs: int = 8
    batch_size: int = 16
    block_size: int = 128
    vocab_size: int = 4096
    max_bytes: int = 6_000_000
    val_batches: int = 16
    lr: float = 1e-3
    seed: int = 0
    threads: int = 1
    comera: dict[str, Any] = field(default_factory=dict)


def data_module(settings: RaceSettings) -> CodeCorpusDataModule:
    data = CodeCorpusDataModule(objective="clm", block_size=settings.block_size, batch_size=settings.batch_size,
                                vocab_size=settings.vocab_size, max_bytes=settings.max_bytes, seed=settings.seed)
    data.prepare_data()
    data.setup("fit")
    return data


def run(system: str, spec: ModelSpec, settings: RaceSettings, data: CodeCorpusDataModule, steps: int | None = None,
        **module_options: Any) -> dict[str, Any]:
    """Train one system; its curve, final loss, parameters and seconds."""
    torch.set_num_threads(settings.threads)
    L.seed_everything(settings.seed, verbose=False)
    steps = steps or settings.steps
    epochs = settings.epochs if steps == settings.steps else max(1, round(settings.epochs * steps / settings.steps))
    module = CausalLM(spec, data.vocab_size, settings.block_size, lr=settings.lr, **module_options)
    curve = Curve()
    callbacks: list[L.Callback] = [curve]
    if system == "comera":
        callbacks.append(ComeraCallback(**settings.comera))
    trainer = L.Trainer(max_epochs=epochs, limit_train_batches=steps // epochs, limit_val_batches=settings.val_batches,
                        num_sanity_val_steps=0, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - started
    stats = compression_stats(module)
    layers = compressible_layers(module.model)
    compressible = sum(p.numel() for name in layers for p in module.model.get_submodule(name).parameters())
    return {
        "system": system, "model": spec.label(), "width": spec.width, "steps": trainer.global_step,
        "final_val_loss": curve.points[-1]["val_loss"], "curve": curve.points,
        "parameters": parameters(module), "compressible_parameters": compressible,
        "tt_parameters": stats.tt_parameters, "train_seconds": round(curve.train_seconds, 1), "wall_seconds": round(wall, 1),
        "low_rank": module.low_rank, "galore_rank": module.galore_rank,
    }


# ---------------------------------------------------------------------------- command line
def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _options(pairs: list[str]) -> dict[str, Any]:
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        options[key] = _value(value)
    return options


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama:256:4", help="family:width:layers, comma-separated")
    parser.add_argument("--systems", default="dense,comera")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--comera", nargs="*", default=[], help="ComeraCallback arguments, key=value (JSON values)")
    parser.add_argument("--tensorize", nargs="*", default=[], help="TensorizeConfig fields, key=value (JSON values)")
    parser.add_argument("--out", default=None, help="append one JSON line per run to this file")
    args = parser.parse_args(argv)
    comera = _options(args.comera)
    if args.tensorize:
        comera["tensorize"] = TensorizeConfig(**_options(args.tensorize))
    settings = RaceSettings(steps=args.steps, epochs=args.epochs, lr=args.lr, seed=args.seed, threads=args.threads, comera=comera)
    data = data_module(settings)
    for model in args.models.split(","):
        spec = ModelSpec.parse(model)
        for system in args.systems.split(","):
            result = run(system, spec, settings, data)
            result["settings"] = {**asdict(settings), "comera": {**_options(args.comera), "tensorize": _options(args.tensorize)}}
            line = json.dumps(result)
            print(f"{spec.label()} {system:8s} final val loss {result['final_val_loss']:.4f}  params {result['parameters']:,}  "
                  f"tt {result['tt_parameters']:,}  train {result['train_seconds']}s  curve "
                  + " ".join(f"{p['val_loss']:.3f}" for p in result["curve"]), flush=True)
            if args.out:
                with open(args.out, "a") as handle:
                    handle.write(line + "\n")


if __name__ == "__main__":
    main()
