"""DLRM at Criteo Kaggle scale: peak memory and step time of a full training step, dense vs TT tables.

Compares TorchRec's dense ``EmbeddingBagCollection`` with ``TTEmbeddingBagCollection`` (26 tables
of ``CRITEO_KAGGLE_TABLE_SIZES``, 33,762,577 rows) inside ``torchrec.models.dlrm.DLRM`` (dense
arch 13-512-256-D, over arch 512-256-1), on a FULL training step: forward, BCE-with-logits,
backward, ``optimizer.step()`` with the SAME optimizer for both (Adagrad by default; ``--optimizer
sgd|adamw``), at batch 4096 with one id per feature from the synthetic Zipf-like generator
(``SyntheticCriteoDataModule``: hot ids repeat within a batch, as in real click logs). docs/METHOD.md §3
claims 99× compression and 7× lower peak memory for DLRM.

Each (system, dim) runs in its own subprocess (``--worker``), so memory is measured cleanly:

* ``import RSS``: resident memory after importing torch/torchrec/comera_lightning (the same for
  every system; reported so that ratios can also be read net of it);
* ``model+state RSS``: resident memory after the warm-up steps with the gradients freed and
  ``malloc_trim`` called: weights plus optimizer state (plus the import baseline);
* ``peak RSS``: ``getrusage(RUSAGE_SELF).ru_maxrss`` at the end: the whole process's high-water
  mark, including the step's working memory (dense gradients, optimizer temporaries, activations);
* ``step ms``: median wall time of ``--steps`` steps after ``--warmup`` steps (the machine is shared:
  times fluctuate, memory does not).

Default and why. At D=128 the dense tables alone are 33.76M×128×4 B = 17.3 GB, and a step with a
dense gradient and Adagrad state needs about 3× that: it cannot run in 24 GB. So the default runs
both systems at D=16 (the DLRM reference's Kaggle setting, 2.2 GB of dense weights, ≈7.5 GB dense
peak) and TT alone at D=128. Whenever the dense peak predicted for a dim exceeds ``--max-gb``
(default 18, and never more than 90 % of MemAvailable), the dense worker is not started and its
memory is COMPUTED: import RSS + weights + optimizer state + the dense gradient + the optimizer's
per-table temporaries of the largest table (a lower bound; activations and the MLPs are left
out). Such rows are labelled ``computed``; at the measured dim the same formula is printed next
to the measurement, to show how close it is. ``--force-dense`` starts the dense worker anyway
(an out-of-memory death is then detected and reported as such). ``--systems`` can add
``tt_from_dense`` (the dense collection is built and then tensorized with ``from_ebc``: what
``tensorize`` does to a ``DLRMClassifier`` with real tables; its peak includes the dense tables)
and ``tt_from_meta`` (the collection is declared on the meta device and tensorized with
``from_ebc``: the ``configs/dlrm.yaml`` path, ``meta_embeddings: true``).

Run (about 3-5 minutes on 2 cores):

    .venv/bin/python -m benchmarks.training.dlrm_memory [--dims 16,128] [--batch 4096] [--optimizer adagrad]
        [--max-rank 32] [--steps 5] [--warmup 2] [--out benchmarks/results/dlrm_memory.json]

This module is the command line; the parts: ``dlrm_systems.py`` (the models, optimizer, step and
batches), ``dlrm_worker.py`` (the worker processes), ``dlrm_runs.py`` (the runs of one dim, the dense
memory computed), ``dlrm_report.py`` (ratios, tables, claims).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.probes import GB, command_line, mem_available
from benchmarks.training.dlrm_report import check_claims, machine, print_table, ratios
from benchmarks.training.dlrm_runs import run_dim
# Also the names other benchmarks import from here (inference/systems.py): make_batches, build_collection, build_model.
from benchmarks.training.dlrm_systems import OPTIMIZERS, SYSTEMS, build_collection, build_model, make_batches
from benchmarks.training.dlrm_worker import worker_main



def parse_args() -> argparse.Namespace:
    """Command-line options (the ``--worker*`` ones are internal)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", default="16,128", help="comma-separated embedding dims")
    parser.add_argument("--systems", default="dense,tt", help=f"comma-separated, from {SYSTEMS}")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adagrad")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--max-rank", type=int, default=32)
    parser.add_argument("--num-cores", type=int, default=3)
    parser.add_argument("--min-rows", type=int, default=1000, help="tables with fewer rows stay dense in the TT collection")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-gb", type=float, default=18.0, help="largest predicted dense peak that is actually run")
    parser.add_argument("--force-dense", action="store_true", help="run the dense worker even above --max-gb")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/dlrm_memory.json"))
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-dim", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error(f"--warmup and --steps must be at least 1, got {args.warmup} and {args.steps}.")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {SYSTEMS}.")
    return args


def main() -> None:
    """Run every (dim, system) in its own process, print the tables and write the JSON."""
    args = parse_args()
    if args.worker:
        worker_main(args)
        return
    dims = [int(d) for d in args.dims.split(",")]
    available = mem_available()
    limit = int(min(args.max_gb * GB, 0.9 * available)) if available else int(args.max_gb * GB)
    print(f"dense runs when its predicted peak <= {limit / GB:.1f} GB (MemAvailable {available / GB:.1f} GB)",
          file=sys.stderr)
    results = {dim: run_dim(dim, args, limit) for dim in dims}
    print_table(results, args)
    checks = check_claims(results)
    payload = {
        "benchmark": "dlrm_memory",
        "command": command_line(),
        "machine": machine(results, args.threads),
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("worker") and k != "out"},
        "dense_limit_bytes": limit,
        "results": {str(dim): rows for dim, rows in results.items()},
        "ratios": {str(dim): ratios(rows) for dim, rows in results.items()},
        "claims": {str(dim): c for dim, c in checks.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
