"""The paper's 6-encoder Transformer: training-step time and peak memory, dense vs CoMERA vs GaLore.

Issue 9, comparisons 1 and 2 (docs/METHOD.md §3: CoMERA 2-3x faster per epoch than dense training at
batch 32-128; 2x faster and 9x less memory than GaLore at batch 1). The model is
``SentencePairClassifier`` at the paper's size (vocabulary 30,522, d_model 768, 6 post-LN encoders,
12 heads, d_ff 3072, 128 learned positions, dropout 0.1) on synthetic token pairs padded to 128
tokens (static shapes, as ``configs/transformer.yaml`` pads them). Systems:

* ``dense``: the plain model, AdamW (``--optimizer came`` for CAME) on the paper's parameter groups;
* ``comera``: the early stage: tensorized as ``configs/transformer.yaml``'s ``comera:`` section does
  (every candidate layer, linear rank 30 with 3 cores per side, embedding rank 32 with 4 cores, gate
  threshold 1e-2, min_compression 2: 39 layers, the token-type table and the classifier stay
  dense), all gates alive; the loss is cross-entropy + 0.01 · ``size_surrogate`` (the early stage's
  ``L + γR``);
* ``comera_pruned``: the late stage after physical pruning. No real late stage is run (it takes
  GPU-days); its state is simulated: in every bond of every TT layer the gates of all but
  ``round(--keep-fraction · rank)`` indices (default 1/3, at least 1) are set to 0, below the
  threshold, and ``comera_lightning.rank.prune_(model, [optimizer])`` slices them out of the cores,
  the gates and the optimizer. At 1/3 (ranks 30 -> 10, 32 -> 11, 12 -> 4) the tensorized layers go
  from 62.6x to 412x smaller than dense (whole model 61x -> 359x), in line with the paper's 43x ->
  361x from the early to the late stage;
* ``galore`` (batch 1 only, the paper's comparison): the dense model trained with
  ``pytorch_optimizer.GaLore`` (AdamW in a gradient subspace): rank 128, ``update_proj_gap`` 200,
  scale 0.25, ``projection_type`` std on the 2-D weights of the encoder linears (attention
  query/key/value/output, FFN intermediate/output); every other parameter plain AdamW in the same
  optimizer.

One step = forward, loss, backward, optimizer step, gradients freed. Two measurements:

* **interleaved** (the headline): every system of a batch size is built in this process and one
  step of each is timed in turn, rotating the order every round, so that load on the machine hits
  all alike; median of ``--steps`` rounds after ``--warmup``. GaLore recomputes its projectors (one
  SVD per projected matrix) on its first step and every 200 steps; the warm-up hides that, so the
  SVDs of all its matrices are timed separately and reported amortized (``+ svd / 200`` per step);
* **one process per (system, batch)** (``--worker``): resident memory after the imports, after
  the warm-up with the gradients freed (weights + optimizer state), and the peak of training
  (``ru_maxrss``; the high-water mark is reset through ``/proc/self/clear_refs`` once the model is
  built, so the dense model that ``tensorize`` starts from does not count; the peak of the build
  is reported as ``peak_build``, and ``VmHWM`` beside ``ru_maxrss`` as a check). The workers run
  before this process imports torch: Linux starts a child's ``ru_maxrss`` at the high-water mark
  of the process that spawned it. After the timed steps one more step runs under
  ``torch.profiler(profile_memory=True)`` for the **tensor peak**: the bytes of live tensors at
  their highest (``tensor_memory.py``), the CPU counterpart of the ``max_memory_allocated`` a GPU
  comparison such as the paper's reports; the resident set also holds the interpreter and
  libraries (``import torch`` alone is 0.23 GB). Worker step times are reported too, but only the
  interleaved ratios compare like with like.

When a ratio misses issue 9's bar (dense/CoMERA time >= 3 at batch 32; GaLore/CoMERA time >= 2 and
peak >= 9 at batch 1, as resident set and as tensor peak), or with ``--profile``, the CoMERA step is profiled with ``torch.profiler``
(CPU, a few steps, top 10 ops by self CPU time). A PNG bar chart is written next to the JSON.

Run time on 2 idle cores (threads 2): about 7 minutes by default (10 + 2 steps), about 4 with ``--quick``.
``--device cuda`` puts models and batches on the GPU (every step ends with a host sync, so times are
complete) and takes the tensor peak from ``torch.cuda.max_memory_allocated`` (reset after the build);
written for GPU users, it has not been run: no GPU was available where this was developed.

    .venv/bin/python -m benchmarks.training.transformer_speed [--quick] [--layers 6] [--batches 32,1]
        [--steps 10] [--warmup 2] [--threads 2] [--optimizer adamw|came] [--keep-fraction 0.333] [--device cpu|cuda]
        [--out benchmarks/results/transformer_speed.json]

This module is the command line; the parts: ``transformer_systems.py`` (the systems and batches),
``transformer_memory.py`` (the worker processes), ``transformer_timing.py`` (the interleaved times,
GaLore's SVDs, the profile), ``transformer_report.py`` (ratios, bars, tables, chart).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.probes import command_line, print_result, release_free_memory
from benchmarks.training.transformer_memory import run_worker, spawn_worker
from benchmarks.training.transformer_report import check_claims, machine, plot, print_tables, ratios
# Also the names other benchmarks import from here (dropout_speed.py, inference/systems.py): TENSORIZE, System,
# build_model, keep_ranks_, make_batches.
from benchmarks.training.transformer_systems import (
    GALORE,
    GALORE_TARGETS,
    LEARNING_RATES,
    RANK_WEIGHT,
    SYSTEMS,
    TENSORIZE,
    System,
    build_model,
    keep_ranks_,
    make_batches,
    systems_for,
)
from benchmarks.training.transformer_timing import profile_step, run_interleaved

QUICK = {"steps": 3, "warmup": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--worker*`` are internal); ``--quick`` lowers the step counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"a few minutes: {QUICK}")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-ff", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batches", default="32,1", help="comma-separated batch sizes (GaLore runs at batch 1)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--optimizer", choices=("adamw", "came"), default="adamw", help="for dense and CoMERA")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: models and batches on the GPU, memory from torch.cuda.max_memory_allocated")
    parser.add_argument("--keep-fraction", type=float, default=1 / 3, help="ranks kept per bond in comera_pruned")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="profile the CoMERA step even when every bar is met")
    parser.add_argument("--no-processes", action="store_true", help="skip the per-process memory runs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/transformer_speed.json"))
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = QUICK["steps"], QUICK["warmup"]
    if args.warmup < 1 or args.steps < 1:
        parser.error(f"--warmup and --steps must be at least 1, got {args.warmup} and {args.steps}.")
    if not 0 < args.keep_fraction <= 1:
        parser.error(f"--keep-fraction must be in (0, 1], got {args.keep_fraction}.")
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    return args


def main(argv: list[str] | None = None) -> None:
    """Interleaved timing per batch size, one process per (system, batch), profile if short; print and save."""
    args = parse_args(argv)
    if args.worker:
        print_result(run_worker(args.worker, args.worker_batch, args))
        return
    if args.device == "cuda":  # checked up front (imports torch here: on a GPU run the GPU figures are the ones to read)
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device here; run without --device (CPU) or on a GPU machine.")
    start = time.perf_counter()
    # Workers first, while this process is small: a child's ru_maxrss starts at its parent's peak.
    processes = {} if args.no_processes else {b: {s: spawn_worker(s, b, args) for s in systems_for(b)} for b in args.batches}
    import torch

    torch.set_num_threads(args.threads)
    interleaved = {}
    for batch in args.batches:
        interleaved[batch] = run_interleaved(batch, args)
        release_free_memory()
    ratio = ratios(interleaved, processes)
    claims = check_claims(ratio)
    missed = {int(k.rsplit("_b", 1)[1]) for k, c in claims.items() if not c["met"]}
    profiles = [profile_step("comera", b, args) for b in args.batches if b in missed or args.profile]
    print_tables(interleaved, processes, ratio, claims, args)
    for prof in profiles:
        print(f"\ntorch.profiler, comera step at batch {prof['batch']} ({prof['steps']} steps, top 10 by self CPU):\n"
              f"{prof['table']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = plot(interleaved, processes, args, args.out.with_suffix(".png"))
    payload = {
        "benchmark": "transformer_speed",
        "command": command_line(),
        "wall_s": time.perf_counter() - start,
        "machine": machine(args),
        "settings": {**{k: v for k, v in vars(args).items() if not k.startswith("worker") and k != "out"},
                     "tensorize": TENSORIZE, "learning_rates": LEARNING_RATES, "rank_weight": RANK_WEIGHT,
                     "galore": GALORE, "galore_targets": GALORE_TARGETS},
        "interleaved": {str(b): rows for b, rows in interleaved.items()},
        "processes": {str(b): rows for b, rows in processes.items()},
        "ratios": ratio,
        "claims": claims,
        "profiles": profiles,
        "png": str(png),
    }
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {args.out} and {png} in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
