"""``transformer_speed.py``'s step times of all systems of one batch size in one process, GaLore's SVDs, the profile."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from benchmarks.training.transformer_systems import GALORE, System, make_batches, systems_for


def run_interleaved(batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Time one step of each system in turn (order rotated every round); medians after the warm-up."""
    names = systems_for(batch_size)
    print(f"  interleaved: {', '.join(names)} at batch {batch_size} ...", file=sys.stderr, flush=True)
    systems = {name: System(name, args) for name in names}
    batches = make_batches(batch_size, args.warmup + args.steps, args)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i, batch in enumerate(batches):
        for name in names[i % len(names):] + names[:i % len(names)]:
            tick = time.perf_counter()
            systems[name].step(batch)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - tick)
    out: dict[str, Any] = {name: {"step_ms_median": 1e3 * statistics.median(t), "step_ms_all": [1e3 * x for x in t],
                                  **systems[name].describe()} for name, t in times.items()}
    if "galore" in systems:
        svd_ms = galore_refresh_ms(systems["galore"])
        out["galore"].update(svd_refresh_ms=svd_ms,
                             step_ms_amortized=out["galore"]["step_ms_median"] + svd_ms / GALORE["update_proj_gap"])
    return out


def galore_refresh_ms(system: System) -> float:
    """Milliseconds of one projector refresh of ``system``'s GaLore: a thin SVD of every projected matrix."""
    import torch

    matrices = [torch.randn_like(p) for group in system.optimizer.param_groups if "rank" in group
                for p in group["params"] if p.dim() == 2]
    start = time.perf_counter()
    for matrix in matrices:
        torch.linalg.svd(matrix, full_matrices=False)
    if matrices and matrices[0].is_cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start)


def profile_step(system: str, batch_size: int, args: argparse.Namespace, steps: int = 3) -> dict[str, Any]:
    """Top 10 ops by self CPU time over ``steps`` steps of ``system`` (after one unprofiled step)."""
    from torch.profiler import ProfilerActivity, profile

    trained = System(system, args)
    batches = make_batches(batch_size, steps + 1, args)
    trained.step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[1:]:
            trained.step(batch)
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in averages)
    top = [{"op": e.key, "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "self_cpu_share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in averages[:10]]
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    return {"system": system, "batch": batch_size, "steps": steps, "top10": top, "table": table}
