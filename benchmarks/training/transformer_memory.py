"""``transformer_speed.py``'s one-process-per-(system, batch) runs: resident memory, tensor peak, step times.

``spawn_worker`` starts ``python -m benchmarks.training.transformer_speed --worker ...``, whose
``run_worker`` builds one system, trains it and prints its measurements.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks.probes import (
    module_command,
    release_free_memory,
    reset_peak,
    rss_now,
    rss_peak,
    spawn_measured,
    vm_hwm,
)
from benchmarks.tensor_memory import optimizer_state_bytes, optimizer_state_tensors, tensor_peak
from benchmarks.training.transformer_systems import System, make_batches

ENTRY = "benchmarks.training.transformer_speed"  # the module a worker process runs


def run_worker(system: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build ``system``, train ``warmup + steps`` steps at ``batch_size``, return memory and times."""
    import torch

    torch.set_num_threads(args.threads)
    import comera_lightning  # noqa: F401  (so that the import baseline includes it)

    if system == "galore":
        import pytorch_optimizer  # noqa: F401

    release_free_memory()
    result: dict[str, Any] = {"system": system, "batch": batch_size, "rss_import": rss_now()}
    batches = make_batches(batch_size, args.warmup + args.steps, args)
    start = time.perf_counter()
    trained = System(system, args)
    result["build_s"] = time.perf_counter() - start
    release_free_memory()
    result["peak_build"] = rss_peak()
    result["rss_built"] = rss_now()
    result["peak_reset"] = reset_peak()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i, batch in enumerate(batches):
        tick = time.perf_counter()
        losses.append(trained.step(batch))
        if i >= args.warmup:
            times.append(time.perf_counter() - tick)
        if i == args.warmup - 1:
            release_free_memory()
            result["rss_model_state"] = rss_now()
    result["peak"] = rss_peak()
    result["vm_hwm"] = vm_hwm()
    if args.device == "cuda":  # the allocator's own statistics, as the paper measures
        result.update(tensor_bytes_before=torch.cuda.memory_allocated(), tensor_peak=torch.cuda.max_memory_allocated())
    else:
        live = [*trained.model.parameters(), *optimizer_state_tensors(trained.optimizer), *batches[-1].values()]
        result.update(tensor_peak(lambda: trained.step(batches[-1]), live))  # after the RSS peak: the profiler costs memory
    result["step_ms_median"] = 1e3 * statistics.median(times)
    result["step_ms_all"] = [1e3 * t for t in times]
    result["losses"] = losses
    result["optimizer_state_bytes"] = optimizer_state_bytes(trained.optimizer)
    result["params_model"] = trained.describe()["params_model"]
    result["torch"] = torch.__version__
    result["threads"] = torch.get_num_threads()
    return result


def spawn_worker(system: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker subprocess: its measurements, or how it failed."""
    command = [*module_command(ENTRY), "--worker", system, "--worker-batch", str(batch_size),
               *model_flags(args)]
    return spawn_measured(command, f"{system} at batch {batch_size}", {"system": system, "batch": batch_size})


def model_flags(args: argparse.Namespace) -> list[str]:
    """The command-line flags a worker needs to rebuild the same systems and steps."""
    names = ("layers", "d_model", "d_ff", "heads", "vocab", "seq", "steps", "warmup", "threads", "optimizer",
             "keep_fraction", "seed", "device")
    return [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in names]
