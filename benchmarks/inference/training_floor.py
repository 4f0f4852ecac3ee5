"""The least a pure-torch TT lookup costs in a training step, beside fbgemm's fused dense tables (issue #28).

Criteo Kaggle tables, Zipf ids (``embedding_workloads.py``), batch ``--batch``, one process,
interleaved rounds (``embedding_timing.interleave``). Per round, each system once on that round's batch:

* ``dense``: TorchRec's ``FusedEmbeddingBagCollection`` (fbgemm's CPU kernels, ``EXACT_ADAGRAD``
  fused into the backward): forward + backward, which is its whole step;
* ``tt``: ``TTEmbeddingBagCollection.from_ebc(meta, max_rank=R, init="random")`` with the defaults:
  forward + backward + ``Adagrad(fused=True)`` step;
* ``floor_rR``: for every table ``tt`` stores as a train, only the arithmetic no TT lookup can skip,
  in its cheapest form: each distinct id of the batch (deduplicated before the clock starts) through
  a **two-core** train of rank R (one ``F.embedding`` gather from each core, one batched matmul:
  16·R multiply-adds per id, the fewest of any TT form of 16-wide rows), forward + backward. No
  deduplication, pooling, gates or optimizer step. The cheapest torch ops we found for it (measured
  side by side: the package's ``gather_rows``, a broadcast multiply-and-sum, ``einsum`` and
  ``torch.compile`` of the same lookup were no faster).

Where ``floor`` is slower than ``dense``, a TT collection made of torch ops cannot train as fast as
fbgemm's fused tables at that rank on this host, however its other work is arranged.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.inference.training_floor [--ranks 32,8,2] [--rounds 9] [--quick] [--out PATH]

About 40 s on 2 cores (the fused dense tables are 2.2 GB).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.inference import embedding_systems as systems
from benchmarks.inference.embedding_timing import interleave
from benchmarks.inference.embedding_workloads import make_workload
from benchmarks.probes import RESULTS, command_line, machine_basics

MIN_ROWS = 1000  # as embedding_speed's default: smaller tables stay dense in ``tt``


class TwoCoreFloor:
    """Two-core trains ``(n1, 4, r) · (n2, r, 4)`` of 16-wide rows for tables of ``sizes`` rows; ``step(ids)``: forward + backward."""

    def __init__(self, sizes: list[int], rank: int, seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.rank, self.cores = rank, []
        for rows in sizes:
            n1 = math.isqrt(rows - 1) + 1
            n2 = -(-rows // n1)
            self.cores.append((n2, torch.randn(n1, 4 * rank, generator=generator).requires_grad_(),
                               torch.randn(n2, rank * 4, generator=generator).requires_grad_()))

    def step(self, ids: list[Any]) -> None:
        import torch
        import torch.nn.functional as F

        outputs = []
        for (n2, left, right), table_ids in zip(self.cores, ids):
            a = F.embedding(table_ids // n2, left).view(-1, 4, self.rank)
            b = F.embedding(table_ids % n2, right).view(-1, self.rank, 4)
            outputs.append(torch.bmm(a, b))
        torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])
        for _, left, right in self.cores:
            left.grad = right.grad = None


def build(workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    """name -> one round's call ``f(batch, distinct TT ids of the batch)``."""
    import torch
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    torch.manual_seed(args.seed)
    configs = workload.configs(16)
    dense = FusedEmbeddingBagCollection(configs, optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.01},
                                        device=torch.device("cpu"))
    tt = systems.tt_collection("tt", workload.configs(16), args.ranks[0], MIN_ROWS)
    optimizer = torch.optim.Adagrad(tt.parameters(), lr=0.01, fused=True)
    tt_sizes = [c.num_embeddings for c in configs if c.num_embeddings >= MIN_ROWS]

    def backward(out: Any) -> None:
        out.values().backward(torch.ones_like(out.values()))

    def train_tt(batch: Any, _: list[Any]) -> None:
        backward(tt(batch.sparse))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    calls = {"dense": lambda batch, _: backward(dense(batch.sparse)), "tt": train_tt}
    for rank in args.ranks:
        floor = TwoCoreFloor(tt_sizes, rank, args.seed)
        calls[f"floor_r{rank}"] = lambda _, distinct, floor=floor: floor.step(distinct)
    return calls


def distinct_tt_ids(batch: Any, sizes: list[int]) -> list[Any]:
    """Each TT table's distinct ids of ``batch`` (one feature per table in Criteo)."""
    import torch

    values = batch.sparse.values().split(batch.sparse.length_per_key())
    return [torch.unique(v) for v, rows in zip(values, sizes) if rows >= MIN_ROWS]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="32,8,2", help="TT rank of tt (the first) and of each floor")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="Criteo tables capped at QUICK_MAX_ROWS rows (the test)")
    parser.add_argument("--out", type=Path, default=RESULTS / "training_floor.json")
    args = parser.parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",")]
    import torch

    torch.set_num_threads(1)
    workload = make_workload("criteo", quick=args.quick)
    batches = workload.batches(args.batch, args.warmup + args.rounds, seed=args.seed + 1)
    distinct = [distinct_tt_ids(batch, workload.table_sizes) for batch in batches]
    calls = build(workload, args)
    timed = interleave({name: (lambda i, f=f: f(batches[i], distinct[i])) for name, f in calls.items()}, args.rounds, args.warmup, 1)
    report = {"host": {**machine_basics(), "torch": torch.__version__, "threads": 1}, "command": command_line(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "distinct_ids_per_step": sum(i.numel() for i in distinct[0]), **timed}
    args.out.write_text(json.dumps(report, indent=1, default=str))
    for name, ms in timed["ms_median"].items():
        ratio = timed.get("dense_over_paired", {}).get(name)
        print(f"{name:10s} {ms:8.2f} ms" + (f"   dense/{name} {ratio:.2f}x" if ratio is not None else ""))
    return report


if __name__ == "__main__":
    main()
