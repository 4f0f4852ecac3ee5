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
from collections.abc import Callable
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

    def torch_rows(self, n2: int, left: Any, right: Any, ids: Any) -> Any:
        """``(len(ids), 4, 4)`` rows of one table: a gather from each core, one batched matmul."""
        import torch
        import torch.nn.functional as F

        return torch.bmm(F.embedding(ids // n2, left).view(-1, 4, self.rank), F.embedding(ids % n2, right).view(-1, self.rank, 4))

    def step(self, ids: list[Any], rows: Callable[..., Any] | None = None) -> None:
        """Forward + backward of every table's ``ids`` through ``rows(n2, left, right, ids)`` (default :meth:`torch_rows`)."""
        import torch

        rows = rows or self.torch_rows
        outputs = [rows(n2, left, right, table_ids) for (n2, left, right), table_ids in zip(self.cores, ids)]
        torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])
        for _, left, right in self.cores:
            left.grad = right.grad = None


def fused_dense(configs: list[Any]) -> Any:
    """TorchRec's ``FusedEmbeddingBagCollection`` of ``configs`` (fbgemm's CPU kernels, Adagrad fused into the backward)."""
    import torch
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    return FusedEmbeddingBagCollection(configs, optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.01},
                                       device=torch.device("cpu"))


def backward_of(collection: Any, batch: Any) -> None:
    """Forward and backward of a collection on ``batch`` (a fused collection updates its tables in the backward)."""
    import torch

    out = collection(batch.sparse).values()
    out.backward(torch.ones_like(out))


def build(workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    """name -> one round's call ``f(batch, distinct TT ids of the batch)``."""
    import torch

    torch.manual_seed(args.seed)
    configs = workload.configs(16)
    dense = fused_dense(configs)
    tt = systems.tt_collection("tt", workload.configs(16), args.ranks[0], MIN_ROWS)
    optimizer = torch.optim.Adagrad(tt.parameters(), lr=0.01, fused=True)

    def train_tt(batch: Any, _: list[Any]) -> None:
        backward_of(tt, batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    calls = {"dense": lambda batch, _: backward_of(dense, batch), "tt": train_tt}
    for rank in args.ranks:
        floor = TwoCoreFloor(tt_sizes(workload), rank, args.seed)
        calls[f"floor_r{rank}"] = lambda _, distinct, floor=floor: floor.step(distinct)
    return calls


def tt_sizes(workload: Any) -> list[int]:
    """Rows of the tables ``tt`` stores as trains."""
    return [n for n in workload.table_sizes if n >= MIN_ROWS]


def distinct_tt_ids(batch: Any, sizes: list[int]) -> list[Any]:
    """Each TT table's distinct ids of ``batch`` (one feature per table in Criteo)."""
    import torch

    values = batch.sparse.values().split(batch.sparse.length_per_key())
    return [torch.unique(v) for v, rows in zip(values, sizes) if rows >= MIN_ROWS]


def floor_parser(description: str, ranks: str, out: str) -> argparse.ArgumentParser:
    """The options both floor scripts take."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ranks", default=ranks, help="TT ranks (comma-separated)")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="Criteo tables capped at QUICK_MAX_ROWS rows (the test)")
    parser.add_argument("--out", type=Path, default=RESULTS / out)
    return parser


def criteo_batches(args: argparse.Namespace) -> tuple[Any, list[Any], list[list[Any]]]:
    """The Criteo workload, its timed batches and each batch's distinct TT ids (one torch thread from here on)."""
    import torch

    torch.set_num_threads(1)
    workload = make_workload("criteo", quick=args.quick)
    batches = workload.batches(args.batch, args.warmup + args.rounds, seed=args.seed + 1)
    return workload, batches, [distinct_tt_ids(batch, workload.table_sizes) for batch in batches]


def write_report(args: argparse.Namespace, timed: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Write the JSON report to ``args.out``, print ms and dense/system per system; the report."""
    import torch

    report = {"host": {**machine_basics(), "torch": torch.__version__, "threads": 1}, "command": command_line(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, **extra, **timed}
    args.out.write_text(json.dumps(report, indent=1, default=str))
    for name, ms in timed["ms_median"].items():
        ratio = timed.get("dense_over_paired", {}).get(name)
        print(f"{name:10s} {ms:8.2f} ms" + (f"   dense/{name} {ratio:.2f}x" if ratio is not None else ""))
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = floor_parser(__doc__.splitlines()[0], "32,8,2", "training_floor.json").parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",")]  # the first is also tt's
    workload, batches, distinct = criteo_batches(args)
    calls = build(workload, args)
    timed = interleave({name: (lambda i, f=f: f(batches[i], distinct[i])) for name, f in calls.items()}, args.rounds, args.warmup, 1)
    return write_report(args, timed, distinct_ids_per_step=sum(i.numel() for i in distinct[0]))


if __name__ == "__main__":
    main()
