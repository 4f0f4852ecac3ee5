r"""The anchors' recipe (docs/METHOD.md §6): LLaMA-60M and LLaMA-130M pre-trained the way GaLore, CoLA and LORO train
them, dense and CoMERA side by side, on one GPU.

``--preset 60m``: width 512, FFN 1,376, 8 blocks, 8 heads, 10K steps (1.3B tokens); ``--preset 130m``: 768 / 2,048 /
12 / 12, 20K steps. Both: 512 sequences of 256 tokens a step (``--micro-batch`` of them per forward pass, gradients
accumulated), AdamW with weight decay 0.01 (CoLA's) and gradient-norm clipping 0.5, 10 % linear warm-up then cosine
to 10 % of the peak LR, a 32,000-token vocabulary, untied output head, bf16-mixed on CUDA, ten validations on 10M
held-out tokens. Every system at every peak LR of ``--lrs``, each reported at its best, through the race's ``fit``
and sweep: the same JSON, markdown table and PNG (``benchmarks/results/recipe_<preset>.json`` and ``.png``).

Data: ``--data-files`` (C4's ``c4-train.*.json.gz``, any ``.jsonl[.gz]`` with a ``text`` field, ``.txt``), validated
on ``--val-files`` (else the last training file), tokenized by ``--tokenizer-file`` (else a byte-level BPE of
``--vocab-size`` trained on the training files, cached); without files, the code corpus (the Python standard library).
The data is read in one pass, as the anchors do; it repeats only when it holds fewer tokens than the budget (the JSON's
``data.passes``).

    python -m benchmarks.quality.recipe --check                       # tiny shapes, a few steps, CPU, seconds
    python -m benchmarks.quality.recipe --preset 60m --device cuda \
        --data-files 'c4/en/c4-train.0000[0-7]-of-01024.json.gz' --val-files c4/en/c4-validation.00000-of-00008.json.gz
    python -m benchmarks.quality.recipe --preset 130m --steps 2000 --batch-size 256   # a scaled-down budget

On a CPU the presets are refused (they need a GPU) unless ``--allow-cpu``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import RESULTS
from benchmarks.quality.models import ModelSpec, attention_heads, dense_parameters
from benchmarks.quality.race import data_module, finish, run_header
from benchmarks.quality.settings import (RaceSettings, _numbers, _options, add_data_arguments, checked, data_settings,
                                         systems_of)

#: The anchors' shapes (GaLore's llama_60m / llama_130m configs; heads: width / 64) and steps.
PRESETS = {"60m": {"spec": ModelSpec("llama", 512, 8, ffn=1376), "steps": 10_000},
           "130m": {"spec": ModelSpec("llama", 768, 12, ffn=2048), "steps": 20_000}}
#: What both presets share: 512 sequences of 256 tokens a step, T5's vocabulary size, ten validations of 10M tokens.
ANCHOR = {"batch_size": 512, "micro_batch": 128, "block_size": 256, "vocab_size": 32_000, "evals": 10,
          "val_tokens": 10_000_000}
#: ``--check``: the same code path with tiny shapes, seconds on a CPU.
CHECK = {"spec": ModelSpec("llama", 64, 2, ffn=172), "steps": 8, "batch_size": 8, "micro_batch": 4, "block_size": 32,
         "vocab_size": 512, "evals": 2, "val_tokens": 256}
#: The anchors' optimizer and schedule (docs/METHOD.md §6).
RECIPE = {"warmup": 0.1, "min_lr": 0.1, "weight_decay": 0.01, "gradient_clip": 0.5, "one_pass": True}
#: 1e-3 puts CoMERA's TT cores (stepped ``core_step_scale`` = 6 times faster) at CoLA's 60M LR, 6e-3; 3e-3 is CoLA's
#: 130M LR, nearer a tuned dense baseline's. Each system is reported at its better one.
DEFAULT_LRS = "1e-3,3e-3"
SHAPE = (("steps", "optimizer steps"), ("batch_size", "sequences a step"),
         ("micro_batch", "sequences a forward pass (the step accumulates gradients over batch / micro)"),
         ("block_size", "tokens a sequence"), ("vocab_size", "the trained BPE's vocabulary"),
         ("evals", "validations, evenly spaced"), ("val_tokens", "held-out tokens a validation reads"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The anchors' LLaMA-60M/130M recipe, dense and CoMERA side by side "
                                                 "(benchmarks/quality/recipe.py).")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="60m")
    parser.add_argument("--check", action="store_true", help="tiny shapes and a few steps: the same code in seconds")
    for name, what in SHAPE:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"{what} (default: the preset's)")
    parser.add_argument("--lrs", default=DEFAULT_LRS, help=f"peak LRs, comma-separated (default {DEFAULT_LRS})")
    parser.add_argument("--systems", default="dense,comera", help="comma-separated race systems (default dense,comera)")
    for name, what in (("comera", "ComeraCallback arguments"), ("tensorize", "TensorizeConfig fields")):
        parser.add_argument(f"--{name}", nargs="*", default=[], help=f"{what}, key=value (JSON values)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when there is one")
    parser.add_argument("--precision", default=None, help="Lightning's (default bf16-mixed on CUDA, 32-true on CPU)")
    parser.add_argument("--allow-cpu", action="store_true", help="train a preset on a CPU anyway (days)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    add_data_arguments(parser)
    parser.add_argument("--out", type=Path, default=None, help="the JSON (default benchmarks/results/recipe_<preset>.json)")
    args = parser.parse_args(argv)
    args.systems = systems_of(parser, args.systems)
    return args


def _device(choice: str) -> str:
    import torch

    found = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and found != "cuda":
        raise SystemExit("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
                         "run on a GPU machine, or --check for the CPU smoke run")
    return found if choice == "auto" else choice


def recipe_of(args: argparse.Namespace) -> tuple[ModelSpec, RaceSettings]:
    """The model and the race settings of ``args``: the preset's (or ``--check``'s) shapes, overridden where given."""
    shape = {**ANCHOR, **(CHECK if args.check else PRESETS[args.preset])}
    shape.update({name: getattr(args, name) for name, _ in SHAPE if getattr(args, name) is not None})
    batch, micro, block = shape["batch_size"], min(shape["micro_batch"], shape["batch_size"]), shape["block_size"]
    if min(batch, micro, shape["evals"], shape["val_tokens"]) < 1 or batch % micro:
        raise SystemExit(f"--batch-size {batch} must be a positive multiple of --micro-batch {micro} (a step is whole "
                         f"micro-batches), and --evals {shape['evals']} and --val-tokens {shape['val_tokens']} positive")
    if shape["steps"] < shape["evals"]:
        raise SystemExit(f"--steps {shape['steps']} is fewer than --evals {shape['evals']} (one validation every few steps)")
    device = _device(args.device)
    lrs = _numbers(args.lrs, float)
    if not lrs:
        raise SystemExit(f"--lrs {args.lrs!r} names no learning rate; e.g. --lrs {DEFAULT_LRS}")
    settings = RaceSettings(
        steps=shape["steps"], epochs=shape["evals"], batch_size=micro, accumulate=batch // micro, block_size=block,
        vocab_size=shape["vocab_size"], val_batches=math.ceil(shape["val_tokens"] / (micro * block)), lr=lrs[0], lrs=lrs,
        max_bytes=max(1_000_000, 4 * shape["steps"] * batch * block), seed=args.seed, threads=args.threads,
        device=device, precision=args.precision or ("bf16-mixed" if device == "cuda" else "32-true"),
        comera=_options(args.comera), tensorize=_options(args.tensorize), **RECIPE, **data_settings(args))
    return shape["spec"], checked(settings)


def refuse_cpu(args: argparse.Namespace, spec: ModelSpec, settings: RaceSettings) -> None:
    """A SystemExit (one line) for a preset on a CPU without ``--allow-cpu``."""
    if settings.device != "cpu" or args.check or args.allow_cpu:
        return
    size = dense_parameters(spec, settings.vocab_size, settings.block_size)
    raise SystemExit(f"the {args.preset} preset ({size / 1e6:.0f}M parameters, {settings.steps:,} steps of "
                     f"{settings.tokens_per_step:,} tokens) needs a GPU: run it with --device cuda on a machine with one, "
                     "or --check for the same code on this CPU with tiny shapes (--allow-cpu trains it here anyway)")


def data_summary(data: Any, settings: RaceSettings) -> dict[str, Any]:
    """Where the tokens came from, how many each split holds, and how many passes over the training ones the budget is."""
    budget = settings.steps * settings.tokens_per_step
    train, val = (int(data.dataset(split).attention_mask.sum()) for split in ("train", "val"))
    summary = {"source": settings.data_files or "code corpus (the Python standard library)",
               "validation": settings.val_files or ("the last training file" if settings.data_files else "held-out files"),
               "train_tokens": train, "val_tokens": val, "budget_tokens": budget, "passes": round(budget / train, 3)}
    print(f"data: {train:,} training tokens for a budget of {budget:,} ({summary['passes']:g} passes); "
          f"{val:,} validation tokens", file=sys.stderr, flush=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec, settings = recipe_of(args)
    refuse_cpu(args, spec, settings)
    import torch

    from benchmarks.quality.sweep import race_model

    torch.set_num_threads(settings.threads)
    started = time.perf_counter()
    data = data_module(settings, train_tokens=settings.steps * settings.tokens_per_step)
    name = "check" if args.check else args.preset
    command = "python -m benchmarks.quality.recipe " + " ".join(sys.argv[1:] if argv is None else argv)
    results = run_header(command, settings, data)
    results.update(preset=name, shape={"width": spec.width, "ffn": spec.ffn, "blocks": spec.layers,
                                       "heads": attention_heads(spec.width)}, data=data_summary(data, settings))
    results["models"][spec.label()] = race_model(spec, settings, data, args.systems)
    finish(results, args.out or RESULTS / f"recipe_{name}.json", started)


if __name__ == "__main__":
    main()
