"""The TT embedding lookup of ``gpu_speed.py``: a 1,000,000 x 64 table at rank 32 against ``nn.Embedding``.

Two cores (how ``tensorize`` stores an ``nn.Embedding``), 32,768 Zipf(1.2) ids scattered over the table (the ids
of ``benchmarks/inference``), the layers side by side with interleaved rounds (``strategy_speed.interleaved_ms``):

* training: forward and backward of the lookup (the fused kernel where it runs, ``comera_lightning/layers/kernels``;
  with ``COMERA_FUSED_KERNELS=0``, the torch path; with ``COMERA_WHOLE_TABLE=1``, through the whole table);
* serving: eval, no autograd, after the ids were counted once (``count_ids``): the hot rows from the cache, the
  misses contracted through the half tables in torch (``layers/table_serving.py``); and the same table with the
  cache off (``cache_rows=0``: every id contracted, by the fused kernel where it runs, and by the torch path).

``--check``: a 20,000 x 16 table at rank 4, 512 ids, on CPU.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.inference.embedding_workloads import ZIPF_A, scatter, zipf_ranks
from benchmarks.probes import environment
from benchmarks.training.strategy_speed import interleaved_ms
from comera_lightning import TTEmbedding
from comera_lightning.layers.kernels import fused_kernels_apply

SHAPE = {"rows": 1_000_000, "dim": 64, "rank": 32, "ids": 32768}
CHECK_SHAPE = {"rows": 20_000, "dim": 16, "rank": 4, "ids": 512}


#: What each route of the lookup runs under: the layers' own choice, the torch path, the whole table.
LAYERS_CHOICE: dict[str, str] = {}
TORCH_PATH = {"COMERA_FUSED_KERNELS": "0", "COMERA_WHOLE_TABLE": "0"}
WHOLE_TABLE = {"COMERA_WHOLE_TABLE": "1"}


def _training(dense: nn.Embedding, tt: TTEmbedding, ids: torch.Tensor) -> dict[str, Callable[[], Any]]:
    grad = torch.randn(ids.numel(), dense.embedding_dim, device=ids.device)

    def step(layer: nn.Module, route: dict[str, str] = LAYERS_CHOICE) -> Callable[[], Any]:
        def call() -> None:
            with environment(**route):
                layer(ids).backward(grad)
        return call

    return {"dense train": step(dense), "tt train": step(tt), "tt train, torch path": step(tt, TORCH_PATH),
            "tt train, whole table": step(tt, WHOLE_TABLE)}


def _serving(dense: nn.Embedding, tt: TTEmbedding, uncached: TTEmbedding, ids: torch.Tensor) -> dict[str, Callable[[], Any]]:
    def call(layer: nn.Module, torch_only: bool = False) -> Callable[[], Any]:
        def serve() -> Any:
            with torch.no_grad(), environment(**(TORCH_PATH if torch_only else LAYERS_CHOICE)):
                return layer(ids)
        return serve

    return {"dense serve": call(dense), "tt serve": call(tt), "tt serve, no cache": call(uncached),
            "tt serve, no cache, torch path": call(uncached, True)}


def lookup_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Milliseconds per call (median of interleaved rounds) and the ratios to ``nn.Embedding``."""
    shape, device = (CHECK_SHAPE if args.check else SHAPE), torch.device("cpu" if args.check else "cuda")
    torch.manual_seed(0)
    ranks = zipf_ranks(np.random.default_rng(0), shape["rows"], shape["ids"], ZIPF_A)
    ids = torch.from_numpy(scatter(ranks, shape["rows"], 0)).to(device)
    dense = nn.Embedding(shape["rows"], shape["dim"], device=device)
    tt = TTEmbedding(shape["rows"], shape["dim"], max_rank=shape["rank"], num_cores=2, device=device)
    tt.count_ids(ids)  # what serving counts from training data
    uncached = TTEmbedding(shape["rows"], shape["dim"], max_rank=shape["rank"], num_cores=2, cache_rows=0, device=device)
    uncached.load_state_dict(tt.state_dict())  # (the same table: hot-row serving never takes the kernel)
    rounds = argparse.Namespace(warmup=args.warmup, steps=args.steps)
    times = interleaved_ms(_training(dense, tt, ids), rounds, device)
    dense.eval()
    tt.eval()  # (entering training mode drops the serving cache: the two groups are timed apart)
    uncached.eval()
    times.update(interleaved_ms(_serving(dense, tt, uncached, ids), rounds, device))
    ms = {name: statistics.median(values) for name, values in times.items()}
    return {**shape, "zipf_a": ZIPF_A, "distinct_ids": int(ids.unique().numel()), "fused_kernel": fused_kernels_apply(tt.cores[0]),
            "tt_parameters": tt.num_parameters(), "dense_parameters": dense.weight.numel(), "ms": ms,
            "tt_over_dense": {"train": ms["tt train"] / ms["dense train"], "serve": ms["tt serve"] / ms["dense serve"]},
            "kernel_speedup": {"train": ms["tt train, torch path"] / ms["tt train"], "serve": ms["tt serve, no cache, torch path"] / ms["tt serve, no cache"]},
            "whole_table_speedup": ms["tt train"] / ms["tt train, whole table"]}
