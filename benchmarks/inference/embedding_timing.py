"""Interleaved timing for ``embedding_speed.py``: every system once per round, order rotated, medians of rounds.

A round calls each system ``calls_per_round(batch)`` times in a row (32 calls at batch 1, one
at 4,096) on that round's batches (the same ids for every system, each on its own copy); a round's
time is the mean per call. The first ``warmup`` rounds are not kept. Ratios are dense ms / system ms
(above 1: the system is faster than the dense tables): ``dense_over`` of the medians, and
``dense_over_paired`` the median of each round's own ratio (the two calls minutes apart on a shared
host drift together; a round's pair does not).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

CALLS_AT_BATCH_1 = 32


def calls_per_round(batch: int) -> int:
    """Calls of one system per round: enough at small batches that a round is not a single ~50 µs call."""
    return max(1, CALLS_AT_BATCH_1 // batch)


def interleave(calls: dict[str, Callable[[int], Any]], rounds: int, warmup: int, per_round: int,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Time ``calls[name](index)`` for every system, interleaved; per-round ms per call, medians, dense ratios.

    ``clock``: wall time by default; ``time.thread_time`` charges only the time this thread ran (on a shared host).
    """
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            tick = clock()
            for j in range(per_round):
                calls[name](i * per_round + j)
            if i >= warmup:
                times[name].append(1e3 * (clock() - tick) / per_round)
    medians = {name: statistics.median(t) for name, t in times.items()}
    result: dict[str, Any] = {"ms_median": medians, "ms_rounds": times, "calls_per_round": per_round}
    if "dense" in medians:
        result["dense_over"] = {name: medians["dense"] / ms for name, ms in medians.items() if name != "dense"}
        result["dense_over_paired"] = {name: statistics.median(d / t for d, t in zip(times["dense"], times[name]))
                                       for name in names if name != "dense"}
    return result


def time_inference(models: dict[str, Any], fresh_batches: Callable[[], list[Any]], args: Any, batch: int) -> dict[str, Any]:
    """The collections' forward alone (``lookup``) and the whole DLRM (``dlrm``), eval + ``inference_mode``.

    Every system and measure gets its own copy of the batches (``fresh_batches()``, the same ids):
    a ``KeyedJaggedTensor`` computes its offsets and lengths on first use and keeps them, so a shared
    batch would charge that work (0.34 of dense's 1.03 ms lookup at batch 1, measured) to whichever system met it first.
    """
    import torch

    from benchmarks.inference.embedding_systems import collection_of

    per_round = calls_per_round(batch)
    lookups = {name: (lambda i, c=collection_of(m), b=fresh_batches(): c(b[i].sparse)) for name, m in models.items()}
    dlrms = {name: (lambda i, m=m, b=fresh_batches(): m(dense_features=b[i].dense, sparse_features=b[i].sparse))
             for name, m in models.items()}
    with torch.inference_mode():
        return {"lookup": interleave(lookups, args.rounds, args.warmup, per_round),
                "dlrm": interleave(dlrms, args.rounds, args.warmup, per_round)}


def first_calls(models: dict[str, Any], fresh_batch: Callable[[], Any]) -> dict[str, float]:
    """ms of each collection's first eval-mode forward (where a TT collection builds its serving cache), each on its own batch."""
    import torch

    from benchmarks.inference.embedding_systems import collection_of

    out = {}
    with torch.inference_mode():
        for name, model in models.items():
            batch = fresh_batch()
            tick = time.perf_counter()
            collection_of(model)(batch.sparse)
            out[name] = 1e3 * (time.perf_counter() - tick)
    return out


def time_training(systems: dict[str, tuple[Any, Any]], fresh_batches: Callable[[], list[Any]], args: Any) -> dict[str, Any]:
    """One training step (forward, BCE, backward, optimizer step) of each system per round, interleaved, each on its own batches."""
    from benchmarks.training.dlrm_systems import train_step

    losses: dict[str, list[float]] = {name: [] for name in systems}

    def step(name: str, batches: list[Any], i: int) -> None:
        model, optimizer = systems[name]
        losses[name].append(train_step(model, optimizer, batches[i]))

    calls = {name: (lambda i, name=name, b=fresh_batches(): step(name, b, i)) for name in systems}
    result = interleave(calls, args.rounds, args.warmup, 1)
    result["losses"] = losses
    return result
