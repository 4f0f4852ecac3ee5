"""``dlrm_memory.py``'s worker: one (system, dim) built and trained in its own process, its memory and step times.

``spawn_worker`` starts ``python -m benchmarks.training.dlrm_memory --worker SYSTEM --worker-dim DIM ...``,
whose ``worker_main`` prints the measurements of ``run_worker``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from benchmarks.probes import module_command, print_result, release_free_memory, rss_now, rss_peak, spawn_measured
from benchmarks.training.dlrm_systems import build_collection, build_model, make_batches, make_optimizer, train_step, unique_fraction

ENTRY = "benchmarks.training.dlrm_memory"  # the module a worker process runs


def run_worker(system: str, dim: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build ``system`` at ``dim``, train ``warmup + steps`` steps, and return its measurements."""
    import torch

    torch.set_num_threads(args.threads)
    import torchrec  # noqa: F401  (imported here so that the import baseline includes it)

    import comera_lightning  # noqa: F401

    release_free_memory()
    result: dict[str, Any] = {"system": system, "dim": dim, "rss_import": rss_now()}
    batches = make_batches(args.batch, args.warmup + args.steps, args.seed)
    result["unique_id_fraction"] = unique_fraction(batches[0])
    start = time.perf_counter()
    collection = build_collection(system, dim, args)
    model = build_model(collection, dim)
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr)
    result["build_s"] = time.perf_counter() - start
    result["rss_built"] = rss_now()
    result["peak_built"] = rss_peak()
    embedding = sum(p.numel() for p in collection.parameters())
    result["params_embedding"] = embedding
    result["params_embedding_dense_equivalent"] = sum(c.num_embeddings * c.embedding_dim for c in collection.embedding_bag_configs())
    result["params_model"] = sum(p.numel() for p in model.parameters())
    losses, times = [], []
    for i, batch in enumerate(batches):
        tick = time.perf_counter()
        losses.append(train_step(model, optimizer, batch))
        if i >= args.warmup:
            times.append(time.perf_counter() - tick)
        if i == args.warmup - 1:
            release_free_memory()
            result["rss_model_state"] = rss_now()
    result.setdefault("rss_model_state", rss_now())
    result["peak"] = rss_peak()
    result["step_ms_median"] = 1e3 * statistics.median(times)
    result["step_ms_all"] = [1e3 * t for t in times]
    result["losses"] = losses
    result["optimizer_state_bytes"] = sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )
    result["torch"] = torch.__version__
    result["torchrec"] = getattr(sys.modules["torchrec"], "__version__", "unknown")
    result["threads"] = torch.get_num_threads()
    return result


def worker_main(args: argparse.Namespace) -> None:
    """Entry point of a ``--worker`` subprocess: print one tagged JSON line."""
    result = run_worker(args.worker, args.worker_dim, args)
    print_result(result)


def spawn_worker(system: str, dim: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker subprocess: its measurements, or how it failed (out of memory included)."""
    command = [
        *module_command(ENTRY), "--worker", system, "--worker-dim", str(dim),
        "--batch", str(args.batch), "--optimizer", args.optimizer, "--lr", str(args.lr),
        "--max-rank", str(args.max_rank), "--num-cores", str(args.num_cores), "--min-rows", str(args.min_rows),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
        "--seed", str(args.seed),
    ]
    return spawn_measured(command, f"{system} at dim {dim}", {"system": system, "dim": dim})
