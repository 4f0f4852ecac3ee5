"""Where a training step's device time goes: the kernels a GPU ran, dense against CoMERA, grouped by kind.

``gpu_speed.py``'s runs (same workloads, systems, ``Trainer.fit`` on synthetic tokens, eager) under
``torch.profiler`` for ``--steps`` steps after the warm-up: per step, the kernels the device ran (the number the
CPU step account predicts), their device time, and that time split into GEMMs, elementwise, reductions, copies,
Triton and the rest; then the longest kernels (the page shows five). Device time is the kernels' own (summed, not
wall): a step slower than dense with fewer FLOPs shows here as slow GEMMs or as time in the other kinds.

``--check`` runs the same code on CPU (tiny shapes, the CPU ops' self time in place of kernels), so the script is
known to run before device time is spent.

    python -m benchmarks.training.gpu_profile [--models llama60m,transformer] [--steps 3] [--check] [--out PATH]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from typing import Any

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader

from benchmarks.probes import RESULTS, command_line, machine_basics, today, write_result
from benchmarks.training.gpu_runs import (CHECK_WORKLOADS, SYSTEMS, WORKLOADS, SyntheticTokens, _trainer, build_module,
                                          release, system_callbacks)

KINDS = (("gemm", r"gemm|sm90_|sm80_|nvjet|cutlass|cublas|matmul|\bmm\b|addmm|bmm|dot"),
         ("triton", r"^triton_|triton|^_forward$|^_backward$"),  # the TT-lookup kernels' names (layers/kernels/)
         ("reduce", r"reduce|sum|norm|softmax|max|mean"),
         ("copy", r"copy|cat|memcpy|memset|fill|index|gather|scatter|embedding"),
         ("elementwise", r"elementwise|vectorized|unrolled|mul|add|div|pow|sigmoid|silu|gelu|where|clamp|exp"))
#: The page shows each run's longest kernels, their names cut (the JSON keeps ``--top`` of them, 120 characters).
SHOWN_KERNELS, SHOWN_NAME = 5, 72


def kind_of(name: str) -> str:
    """The kind of a kernel (or, on CPU, of an aten op) from its name."""
    lowered = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, lowered)), "other")


class ProfileSteps(L.Callback):
    """Steps the profiler's schedule once per training batch."""

    def __init__(self, profiler: profile) -> None:
        self.profiler = profiler

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.profiler.step()


def device_events(profiler: profile, cuda: bool) -> list[tuple[str, int, float]]:
    """(name, calls, self µs) of each kernel (CUDA) or, on CPU, each aten op with self time."""
    rows = []
    for event in profiler.key_averages():
        if getattr(event, "is_user_annotation", False):  # record_function ranges (Optimizer.step#..., ProfilerStep*)
            continue
        if cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            micros = event.self_device_time_total
        else:
            if not event.key.startswith("aten::"):
                continue
            micros = event.self_cpu_time_total
        if micros > 0:
            rows.append((event.key, event.count, float(micros)))
    return rows


def profiled_fit(workload: Any, system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One eager run profiled over ``args.steps`` steps after ``args.warmup``: per-step kernels and device time by kind."""
    cuda = not args.check
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities, schedule=schedule(wait=args.warmup, warmup=1, active=args.steps, repeat=1)) as profiler:
        trainer = _trainer("eager", args.precision, args.warmup + 1 + args.steps + 1,
                           [*system_callbacks(system, args.check), ProfileSteps(profiler)], cuda)
        module = build_module(workload)
        count = workload.batch * (args.warmup + args.steps + 2)
        trainer.fit(module, DataLoader(SyntheticTokens(workload, count), batch_size=workload.batch, pin_memory=cuda))
        if cuda:
            torch.cuda.synchronize()
    events = device_events(profiler, cuda)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, calls, micros in events:
        totals = by_kind[kind_of(name)]
        totals[0] += calls / args.steps
        totals[1] += micros / args.steps / 1000
    top = sorted(events, key=lambda e: -e[2])[: args.top]
    return {"model": workload.name, "system": system, "precision": args.precision,
            "kernels_per_step": sum(c for _, c, _ in events) / args.steps,
            "device_ms_per_step": sum(m for _, _, m in events) / args.steps / 1000,
            "by_kind": {k: {"kernels": v[0], "ms": v[1]} for k, v in sorted(by_kind.items())},
            "top": [{"name": n[:120], "kind": kind_of(n), "per_step": c / args.steps, "ms": m / args.steps / 1000}
                    for n, c, m in top]}


def markdown(result: dict[str, Any]) -> str:
    """Per run: kernels and device ms per step by kind, beside dense's; then each run's longest kernels."""
    unit = "kernels" if result["cuda"] else "aten ops (CPU check)"
    lines = [f"Device time per step on **{result['machine'].get('device', '?')}** ({result['date']}), eager "
             f"{result['precision']}, {result['steps']} profiled steps after {result['warmup']}: `{result['command']}`", "",
             f"| model | system | {unit} / step | device ms / step | × dense | " +
             " | ".join(f"{k} ms (n)" for k, _ in (*KINDS, ("other", ""))) + " |",
             "|---|---|---|---|---|" + "---|" * (len(KINDS) + 1)]
    dense = {r["model"]: r["device_ms_per_step"] for r in result["runs"] if r["system"] == "dense"}
    for r in result["runs"]:
        ratio = r["device_ms_per_step"] / dense[r["model"]] if dense.get(r["model"]) else float("nan")
        cells = [f"{r['by_kind'][k]['ms']:.2f} ({r['by_kind'][k]['kernels']:.0f})" if k in r["by_kind"] else "-"
                 for k in (*(k for k, _ in KINDS), "other")]
        lines.append(f"| {r['model']} | {r['system']} | {r['kernels_per_step']:,.0f} | {r['device_ms_per_step']:.2f} | "
                     f"{ratio:.2f} | " + " | ".join(cells) + " |")
    for r in result["runs"]:
        lines += ["", f"Longest in {r['model']} {r['system']}:", "", "| kernel | kind | per step | ms / step |", "|---|---|---|---|"]
        lines += [f"| `{t['name'][:SHOWN_NAME]}` | {kind_of(t['name'])} | {t['per_step']:.0f} | {t['ms']:.3f} |"
                  for t in r["top"][:SHOWN_KERNELS]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama60m,transformer")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="longest kernels listed per run")
    parser.add_argument("--check", action="store_true", help="the same code on CPU, tiny shapes")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not args.check and not torch.cuda.is_available():
        sys.exit("gpu_profile: torch sees no CUDA device (--check runs the code path on CPU)")
    workloads = CHECK_WORKLOADS if args.check else WORKLOADS
    runs = []
    for model in args.models.split(","):
        for system in SYSTEMS[workloads[model].kind]:
            print(f"  {model} {system} ...", file=sys.stderr, flush=True)
            runs.append(profiled_fit(workloads[model], system, args))
            release(compiled=False)
    device = "cpu (--check)" if args.check else torch.cuda.get_device_name()
    result = {"date": today(), "command": command_line(), "machine": {**machine_basics(), "device": device}, "cuda": not args.check,
              "precision": args.precision, "steps": args.steps, "warmup": args.warmup, "runs": runs}
    write_result(args.out or str(RESULTS / ("gpu_profile_check.json" if args.check else "gpu_profile.json")), result, markdown(result))
    return result


if __name__ == "__main__":
    main()
