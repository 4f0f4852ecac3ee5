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

The long-horizon race (``sweep.py``): ``--tokens-per-param 20`` trains each model for 20 tokens per dense
parameter (the budget users train for), ``--lrs 3e-4,1e-3,3e-3`` trains every system at each peak LR and the
headline compares each at its best, ``--seeds 1`` reruns dense and CoMERA at their best LR with another seed
(the spread), ``--warmup 0.1 --min-lr 0.1`` is the anchors' schedule (docs/TUNING.md, "The long-horizon race").

The full race (four models, 400 steps each; a few hours in all on 2 cores, estimated) as two
one-thread processes side by side, one per family, then merged into one JSON, PNG and table:

    python -m benchmarks.quality --models llama:256:4,llama:512:4 --out benchmarks/results/quality_llama.json &
    python -m benchmarks.quality --models gpt2:256:4,gpt2:512:4 --out benchmarks/results/quality_gpt2.json &
    wait
    python -m benchmarks.quality --out benchmarks/results/quality.json \
        --merge benchmarks/results/quality_llama.json benchmarks/results/quality_gpt2.json

Text files instead of the code corpus: ``--data-files`` (C4 shards, ``.jsonl[.gz]``, ``.txt``; ``--val-files``,
``--tokenizer-file``). The anchors' LLaMA-60M/130M recipe on a GPU is ``recipe.py`` on this machinery.

Results go to ``benchmarks/results/quality[_quick].json`` and ``.png`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.probes import RESULTS, ROOT, machine_basics
from benchmarks.quality import report
from benchmarks.quality.models import ModelSpec, narrow_width
from benchmarks.quality.settings import QUICK_MODELS, FULL_MODELS, SYSTEMS, RaceSettings, parse_args, settings_of

__all__ = ["SYSTEMS", "RaceSettings", "comera_callback", "data_module", "finish", "fit", "main", "print_result", "race_at_lr",
           "run_header"]


def data_module(settings: RaceSettings, train_tokens: int | None = None) -> Any:
    """The causal-LM data, split and tokenized (the tokenizer is cached): ``settings.data_files`` (at most
    ``train_tokens`` tokens of them; a file the reader refuses is a SystemExit naming it), else the code corpus."""
    from comera_lightning.data import CodeCorpusDataModule

    if settings.data_files:
        try:
            return _ready(_text_files(settings, train_tokens))
        except (ValueError, FileNotFoundError) as error:
            raise SystemExit(f"--data-files: {error}") from None
    return _ready(CodeCorpusDataModule(objective="clm", block_size=settings.block_size, batch_size=settings.batch_size,
                                       vocab_size=settings.vocab_size, max_bytes=settings.max_bytes, seed=settings.seed,
                                       tokenizer_file=settings.tokenizer_file))


def _text_files(settings: RaceSettings, train_tokens: int | None) -> Any:
    """The text files' data module; validation reads only the blocks it uses."""
    from comera_lightning.data import TextFilesDataModule

    return TextFilesDataModule(settings.data_files, settings.val_files or None, text_field=settings.text_field,
                               block_size=settings.block_size, batch_size=settings.batch_size,
                               vocab_size=settings.vocab_size, tokenizer_file=settings.tokenizer_file,
                               max_train_tokens=train_tokens,
                               max_val_tokens=settings.val_batches * settings.batch_size * settings.block_size,
                               seed=settings.seed)


def _ready(data: Any) -> Any:
    """``data`` with its tokenizer built and its training and validation blocks packed."""
    data.prepare_data()
    data.setup("fit")
    return data


def comera_callback(settings: RaceSettings) -> Any:
    """``ComeraCallback()`` with its defaults, plus the race's ``--comera`` / ``--tensorize`` overrides.

    In one pass over the data (``settings.one_pass``: no epochs to count) the defaults take their schedule from the
    Trainer's ``max_steps`` (the early stage two thirds of it, the budget's prunes over the late stage's first half).
    """
    from comera_lightning import ComeraCallback, TensorizeConfig

    options = dict(settings.comera)
    if settings.tensorize:
        options["tensorize"] = TensorizeConfig(**settings.tensorize)
    return ComeraCallback(**options)


def fit(system: str, spec: ModelSpec, settings: RaceSettings, data: Any, *, lr: float, steps: int, seed: int | None = None,
        per_epoch: int | None = None, **module_options: Any) -> tuple[dict[str, Any], Any]:
    """Train one system for ``steps`` at peak ``lr``; its result (curve, final loss, parameters, memory, seconds) and module.

    ``settings.epochs`` validations evenly spaced (each ending an epoch unless ``settings.one_pass``), or one every
    ``per_epoch`` steps when given (``dense_time``, whose steps are not the race's).
    """
    import lightning as L
    import torch

    from benchmarks.quality.lm import CausalLM, Curve
    from benchmarks.quality.models import layer_sizes, parameters
    from comera_lightning.rank import compression_stats

    seed = settings.seed if seed is None else seed
    torch.set_num_threads(settings.threads)
    L.seed_everything(seed, verbose=False)
    epochs = min(settings.epochs, steps) if per_epoch is None else max(1, round(steps / per_epoch))
    module = CausalLM(spec, data.vocab_size, settings.block_size, lr=lr, weight_decay=settings.weight_decay,
                      warmup=settings.warmup, min_lr=settings.min_lr, **module_options)
    curve = Curve(module.measure_step)
    callbacks = [curve, comera_callback(settings)] if system == "comera" else [curve]
    trainer = _trainer(settings, steps // epochs, epochs, callbacks)
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - started
    if trainer.global_step < steps // epochs * epochs:
        raise SystemExit(f"{system} trained {trainer.global_step} of {steps} steps: an epoch of the data holds fewer than "
                         f"{steps // epochs} steps of batches; raise --max-bytes (or give more --data-files) or --epochs")
    points = [{**p, "tokens": p["step"] * settings.tokens_per_step} for p in curve.points]
    result = {
        "system": system, "model": spec.label(), "family": spec.family, "width": spec.width, "layers": spec.layers,
        "lr": lr, "seed": seed, "steps": trainer.global_step, "final_val_loss": points[-1]["val_loss"], "curve": points,
        "parameters": parameters(module), "tt_parameters": compression_stats(module).tt_parameters,
        "memory": module.memory, "train_seconds": round(curve.total_seconds, 1), "wall_seconds": round(wall, 1),
        "layer_sizes": layer_sizes(module.model),
    }
    return result, module


def _trainer(settings: RaceSettings, per_epoch: int, epochs: int, callbacks: list[Any]) -> Any:
    """A Trainer for ``epochs`` validations ``per_epoch`` optimizer steps apart (``settings.one_pass``: across
    one pass over the data, else each after an epoch of its own)."""
    import lightning as L

    batches = per_epoch * settings.accumulate
    if settings.one_pass:
        span = {"max_steps": per_epoch * epochs, "max_epochs": -1, "val_check_interval": batches,
                "check_val_every_n_epoch": None}
    else:
        span = {"max_epochs": epochs, "limit_train_batches": batches}
    return L.Trainer(**span, limit_val_batches=settings.val_batches, accumulate_grad_batches=settings.accumulate,
                     gradient_clip_val=settings.gradient_clip or None, precision=settings.precision,
                     num_sanity_val_steps=0, callbacks=callbacks, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator=settings.device, devices=1)


def print_result(result: dict[str, Any]) -> None:
    print(f"{result['model']} {result['system']:10s} lr {result['lr']:g} seed {result['seed']} val loss "
          f"{result['final_val_loss']:.4f}  params {result['parameters']:,}  steps {result['steps']}  train "
          f"{result['train_seconds']}s  curve " + " ".join(f"{p['val_loss']:.3f}" for p in result["curve"]),
          file=sys.stderr, flush=True)


def race_at_lr(spec: ModelSpec, settings: RaceSettings, data: Any, systems: list[str], lr: float,
               steps: int) -> dict[str, dict[str, Any]]:
    """Every system of ``systems`` but ``dense_time`` at peak ``lr`` for ``steps``, in ``SYSTEMS`` order."""
    from comera_lightning.rank import tt_layers

    results: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    budget = 0
    for system in [s for s in SYSTEMS if s in systems and s != "dense_time"]:
        if system in ("dense", "galore"):
            result, _ = fit(system, spec, settings, data, lr=lr, steps=steps,
                            galore=settings.galore if system == "galore" else None)
        elif system == "comera":
            result, module = fit(system, spec, settings, data, lr=lr, steps=steps)
            names = [name for name, _ in tt_layers(module.model)]
            budget = result["tt_parameters"]
            result["tensorized_layers"] = names
        elif system == "narrow":
            width = narrow_width(spec, results["comera"]["parameters"], data.vocab_size, settings.block_size,
                                 settings.narrow_multiple)
            result, _ = fit(system, spec.with_width(width), settings, data, lr=lr, steps=steps)
        else:
            result, module = fit(system, spec, settings, data, lr=lr, steps=steps, low_rank=(names, budget))
            result.update(low_rank_rank=module.rank, low_rank_budget=budget)
        results[system] = result
        print_result(result)
    for result in results.values():
        sizes = result.pop("layer_sizes")
        tensorized = result["system"] == "comera"
        result["compressible_parameters"] = result["tt_parameters"] if tensorized else sum(sizes.get(n, 0) for n in names)
    return results


def _revision() -> str | None:
    proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or None


def run_header(command: str, settings: RaceSettings, data: Any) -> dict[str, Any]:
    """What a results JSON starts with: the command, the machine (its GPU on CUDA), the settings, the vocabulary."""
    import torch
    import transformers

    machine = {**machine_basics(), "torch": torch.__version__, "transformers": transformers.__version__,
               "platform": platform.platform(), "revision": _revision()}
    if settings.device == "cuda":
        machine["gpu"] = torch.cuda.get_device_name()
    return {"command": command.replace(f"{ROOT}/", ""), "machine": machine, "settings": asdict(settings),
            "vocab_size": data.vocab_size, "models": {}}


def finish(results: dict[str, Any], out: Path, started: float) -> None:
    """Write the JSON and PNG at ``out``; print the markdown table (and the LR grid of a sweep)."""
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    out, png = report.write(results, out)
    print(report.markdown_table(results))
    if len(results["settings"]["lrs"]) > 1:
        print("\n" + report.grid_table(results))
    print(f"\nwrote {out} and {png} ({results['wall_seconds']:.0f} s)", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        out, png = report.write(report.merge(args.merge), args.out)
        print(report.markdown_table(json.loads(out.read_text())))
        print(f"\nwrote {out} and {png}", file=sys.stderr)
        return
    import torch

    from benchmarks.quality.sweep import race_model

    settings = settings_of(args)
    torch.set_num_threads(settings.threads)
    started = time.perf_counter()
    data = data_module(settings)
    models = [ModelSpec.parse(m) for m in (args.models or (QUICK_MODELS if args.quick else FULL_MODELS)).split(",")]
    command = "python -m benchmarks.quality " + " ".join(sys.argv[1:] if argv is None else argv)
    results = run_header(command, settings, data)
    for spec in models:
        results["models"][spec.label()] = race_model(spec, settings, data, args.systems)
    finish(results, args.out or RESULTS / f"quality{'_quick' if args.quick else ''}.json", started)
