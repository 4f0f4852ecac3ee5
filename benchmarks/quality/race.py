r"""The quality race: causal-LM pre-training with CoMERA against what a user would do instead.

Random-init Hugging Face causal LMs (Llama- and GPT-2-style) learn next-token prediction on the
package's code corpus (the Python standard library, byte-level BPE) inside one plain
LightningModule (``lm.py``) with one AdamW and a warm-up + cosine schedule. Per model, in one
process, same data, seed and steps, in this order:

* ``dense``: the model as configured;
* ``comera``: the same module with ``ComeraCallback()`` and its defaults (plus ``--comera key=value``);
* ``narrow``: a dense model of the same family whose width (a multiple of 16, ``--narrow-multiple``)
  gives the parameter count closest to CoMERA's at the end;
* ``lowrank``: every layer CoMERA tensorized (``comera_lightning.rank.tt_layers``) replaced by a plain
  ``U·V`` of one rank, the largest whose parameters fit CoMERA's final count in those layers;
* ``galore``: the dense model with ``pytorch_optimizer.GaLore`` (rank width/4 on the blocks' linear maps);
* ``dense_time``: the dense model given CoMERA's training seconds instead of its steps: its own
  warm-up + cosine over the steps that fit, from dense's seconds per step.

Reported per system (JSON): the validation curve (step, training seconds, loss, parameters), the
final loss, parameters (whole model and in the layers CoMERA tensorized), the tensor peak of a
training step (``lm.py``), the seconds; per model a summary: loss at equal steps and at equal
wall-clock (CoMERA's training seconds, each curve interpolated), relative to dense. The PNG draws
validation loss against seconds, one curve per system, one panel per model; the markdown table
printed at the end is the README's.

    python -m benchmarks.quality --quick        # a tiny Llama, 60 steps, all systems (about a minute)
    python -m benchmarks.quality --models llama:256:4 --systems dense,comera --comera gate_lr=0.01

The full race (four models, 400 steps each; a few hours in all on 2 cores, estimated) as two
one-thread processes side by side, one per family, then merged into one JSON, PNG and table:

    python -m benchmarks.quality --models llama:256:4,llama:512:4 --out benchmarks/results/quality_llama.json &
    python -m benchmarks.quality --models gpt2:256:4,gpt2:512:4 --out benchmarks/results/quality_gpt2.json &
    wait
    python -m benchmarks.quality --out benchmarks/results/quality.json \
        --merge benchmarks/results/quality_llama.json benchmarks/results/quality_gpt2.json

Results go to ``benchmarks/results/quality[_quick].json`` and ``.png`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from benchmarks.probes import RESULTS, ROOT, machine_basics
from benchmarks.quality import report
from benchmarks.quality.models import ModelSpec, narrow_width

SYSTEMS = ("dense", "comera", "narrow", "lowrank", "galore", "dense_time")
NEEDS = {"narrow": ("comera",), "lowrank": ("comera",), "dense_time": ("dense", "comera")}
FULL_MODELS = "llama:256:4,gpt2:256:4,llama:512:4,gpt2:512:4"


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
    narrow_multiple: int = 16
    comera: dict[str, Any] = field(default_factory=dict)
    tensorize: dict[str, Any] = field(default_factory=dict)
    galore: dict[str, Any] = field(default_factory=dict)


QUICK = {"steps": 60, "epochs": 4, "batch_size": 8, "block_size": 64, "vocab_size": 1024, "max_bytes": 1_500_000,
         "val_batches": 8}
QUICK_MODELS = "llama:128:2"


def data_module(settings: RaceSettings) -> Any:
    """The code corpus for causal LM, split and tokenized (the tokenizer is cached)."""
    from comera_lightning.data import CodeCorpusDataModule

    data = CodeCorpusDataModule(objective="clm", block_size=settings.block_size, batch_size=settings.batch_size,
                                vocab_size=settings.vocab_size, max_bytes=settings.max_bytes, seed=settings.seed)
    data.prepare_data()
    data.setup("fit")
    return data


def comera_callback(settings: RaceSettings) -> Any:
    """``ComeraCallback()`` with its defaults, plus the race's ``--comera`` / ``--tensorize`` overrides."""
    from comera_lightning import ComeraCallback, TensorizeConfig

    options = dict(settings.comera)
    if settings.tensorize:
        options["tensorize"] = TensorizeConfig(**settings.tensorize)
    return ComeraCallback(**options)


def fit(system: str, spec: ModelSpec, settings: RaceSettings, data: Any, steps: int | None = None,
        **module_options: Any) -> tuple[dict[str, Any], Any]:
    """Train one system; its result (curve, final loss, parameters, memory, seconds) and its trained module."""
    import lightning as L
    import torch

    from benchmarks.quality.lm import CausalLM, Curve
    from benchmarks.quality.models import layer_sizes, parameters
    from comera_lightning.rank import compression_stats

    torch.set_num_threads(settings.threads)
    L.seed_everything(settings.seed, verbose=False)
    per_epoch = max(1, settings.steps // settings.epochs)  # validation after every epoch: the curve's points
    epochs = settings.epochs if steps is None else max(1, round(steps / per_epoch))
    steps = per_epoch * epochs if steps is None else steps
    module = CausalLM(spec, data.vocab_size, settings.block_size, lr=settings.lr, **module_options)
    curve = Curve(module.measure_step)
    callbacks = [curve, comera_callback(settings)] if system == "comera" else [curve]
    trainer = L.Trainer(max_epochs=epochs, limit_train_batches=steps // epochs, limit_val_batches=settings.val_batches,
                        num_sanity_val_steps=0, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - started
    result = {
        "system": system, "model": spec.label(), "family": spec.family, "width": spec.width, "layers": spec.layers,
        "steps": trainer.global_step, "final_val_loss": curve.points[-1]["val_loss"], "curve": curve.points,
        "parameters": parameters(module), "tt_parameters": compression_stats(module).tt_parameters,
        "memory": module.memory, "train_seconds": round(curve.total_seconds, 1), "wall_seconds": round(wall, 1),
        "layer_sizes": layer_sizes(module.model),
    }
    return result, module


def _print(result: dict[str, Any]) -> None:
    print(f"{result['model']} {result['system']:10s} val loss {result['final_val_loss']:.4f}  params {result['parameters']:,}  "
          f"steps {result['steps']}  train {result['train_seconds']}s  curve "
          + " ".join(f"{p['val_loss']:.3f}" for p in result["curve"]), file=sys.stderr, flush=True)


def race_model(spec: ModelSpec, settings: RaceSettings, data: Any, systems: list[str]) -> dict[str, Any]:
    """Every system of ``systems`` on ``spec``, in ``SYSTEMS`` order; their results and the summary."""
    from comera_lightning.rank import tt_layers

    results: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    budget = 0

    def record(result: dict[str, Any], **extra: Any) -> None:
        results[result["system"]] = {**result, **extra}
        _print(result)

    for system in [s for s in SYSTEMS if s in systems]:
        if system in ("dense", "galore"):
            result, _ = fit(system, spec, settings, data, galore=settings.galore if system == "galore" else None)
            record(result)
        elif system == "comera":
            result, module = fit(system, spec, settings, data)
            names = [name for name, _ in tt_layers(module.model)]
            budget = result["tt_parameters"]
            record(result, tensorized_layers=names)
        elif system == "narrow":
            width = narrow_width(spec, results["comera"]["parameters"], data.vocab_size, settings.block_size,
                                 settings.narrow_multiple)
            result, _ = fit(system, spec.with_width(width), settings, data)
            record(result)
        elif system == "lowrank":
            result, module = fit(system, spec, settings, data, low_rank=(names, budget))
            record(result, low_rank_rank=module.rank, low_rank_budget=budget)
        else:
            dense = results["dense"]
            steps = max(1, int(results["comera"]["train_seconds"] / (dense["train_seconds"] / dense["steps"])))
            result, _ = fit(system, spec, settings, data, steps=steps)
            record(result)
    for result in results.values():
        sizes = result.pop("layer_sizes")
        tensorized = result["system"] == "comera"
        result["compressible_parameters"] = result["tt_parameters"] if tensorized else sum(sizes.get(n, 0) for n in names)
    return {"systems": results, "summary": report.summarize(results)}


# ---------------------------------------------------------------------------- command line
def _options(pairs: list[str]) -> dict[str, Any]:
    """``["gate_lr=0.01", "early_epochs=[3]"]`` -> ``{"gate_lr": 0.01, ...}`` (JSON values, else strings)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help=f"family:width:layers, comma-separated (default {FULL_MODELS})")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MODELS}, {QUICK['steps']} steps, small data")
    for f in fields(RaceSettings):
        if f.type in ("int", "float"):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.type == "int" else float, default=None)
    for name, what in (("comera", "ComeraCallback arguments"), ("tensorize", "TensorizeConfig fields"),
                       ("galore", "GaLore group options (rank, update_proj_gap, scale, ...)")):
        parser.add_argument(f"--{name}", nargs="*", default=[], help=f"{what}, key=value (JSON values)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON (the PNG goes beside it)")
    parser.add_argument("--merge", nargs="+", default=None, help="race JSONs to merge into --out (nothing is trained)")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    missing = sorted({f"{s} needs {n}" for s in systems for n in NEEDS.get(s, ()) if n not in systems})
    if unknown or missing:
        parser.error(f"unknown systems {unknown}" if unknown else "; ".join(missing))
    if args.merge and args.out is None:
        parser.error("--merge needs --out")
    args.systems = systems
    return args


def settings_of(args: argparse.Namespace) -> RaceSettings:
    given = {f.name: getattr(args, f.name) for f in fields(RaceSettings) if f.type in ("int", "float")
             and getattr(args, f.name) is not None}
    settings = RaceSettings(**{**(QUICK if args.quick else {}), **given},
                            comera=_options(args.comera), tensorize=_options(args.tensorize), galore=_options(args.galore))
    if settings.steps < settings.epochs:
        raise SystemExit(f"--steps {settings.steps} is fewer than --epochs {settings.epochs} (one validation per epoch)")
    if settings.steps % settings.epochs:
        settings.steps -= settings.steps % settings.epochs
        print(f"steps rounded down to {settings.steps}, a multiple of {settings.epochs} epochs", file=sys.stderr)
    return settings


def _revision() -> str | None:
    proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        out, png = report.write(report.merge(args.merge), args.out)
        print(report.markdown_table(json.loads(out.read_text())))
        print(f"\nwrote {out} and {png}", file=sys.stderr)
        return
    import torch
    import transformers

    settings = settings_of(args)
    torch.set_num_threads(settings.threads)
    started = time.perf_counter()
    data = data_module(settings)
    models = [ModelSpec.parse(m) for m in (args.models or (QUICK_MODELS if args.quick else FULL_MODELS)).split(",")]
    results: dict[str, Any] = {
        "command": "python -m benchmarks.quality " + " ".join(sys.argv[1:] if argv is None else argv).replace(f"{ROOT}/", ""),
        "machine": {**machine_basics(), "torch": torch.__version__, "transformers": transformers.__version__,
                    "platform": platform.platform(), "revision": _revision()},
        "settings": asdict(settings), "vocab_size": data.vocab_size, "models": {},
    }
    for spec in models:
        results["models"][spec.label()] = race_model(spec, settings, data, args.systems)
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    out, png = report.write(results, args.out or RESULTS / f"quality{'_quick' if args.quick else ''}.json")
    print(report.markdown_table(results))
    print(f"\nwrote {out} and {png} ({results['wall_seconds']:.0f} s)", file=sys.stderr)
