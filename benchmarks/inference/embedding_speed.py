"""TT embeddings vs dense tables, in training and in serving (issue #28): lookup, DLRM inference, training step, bytes.

Systems (``embedding_systems.py``): ``dense`` (TorchRec ``EmbeddingBagCollection``; for training
``FusedEmbeddingBagCollection`` with fbgemm's fused Adagrad), ``int8`` (TorchRec's quantised
collection, inference only), ``tt_before`` (``TTEmbeddingBagCollection`` with ``cache_rows=0,
lookup="tables"``: the code before the hot-row cache) and ``tt`` (the defaults), ``tt_pruned`` (``tt`` with a third of every bond kept, pruned), all from
``from_ebc(meta, max_rank=32, init="random")``, each inside TorchRec's DLRM (dense arch
num_dense-512-256-16, over arch 512-256-1). Workloads (``embedding_workloads.py``): ``criteo``
(the 26 Kaggle tables, 33.8M rows, Zipf(1.2) ids scattered per table; ``--zipf``) and
``movielens`` (MovieLens-100K's real ids, tables of its real sizes).

Per workload, in one process (``embedding_timing.py``: interleaved rounds, order rotated, medians):

1. the TT collections count the ids of ``--count-batches`` training batches (``count_ids``;
   another seed, or MovieLens's train split), then the first eval forward of each collection is
   timed alone (``first call ms``: where TT builds its serving cache);
2. ``lookup``: the collection's forward alone, and ``dlrm``: the whole DLRM, both eval +
   ``torch.inference_mode()``, at every ``--batches`` size; every system and measure on its own
   copy of the batches (same ids: a ``KeyedJaggedTensor`` caches its offsets on first use);
3. bytes after the timed inference: ``inference_bytes()`` (TT) or parameters+buffers (dense,
   int8); ``torch.save(state_dict)`` of the DLRM; the DLRM exported through
   ``comera_lightning.export`` (dense-tensor entry point; every system but int8);
4. the inference models are freed, then one training step per system and round at
   ``--train-batch`` (forward, BCE, backward, optimizer step): dense fbgemm's fused Adagrad +
   torch's fused Adagrad on the MLPs, TT torch's fused Adagrad on everything.

Writes ``benchmarks/results/embedding_speed.json`` (host, settings, per-round times) and prints
markdown. One torch thread by default (the host is shared; see docs/INFERENCE_MEASURED.md, "Threads").
Run time on 2 shared cores: about 105 s, peak RSS 8.1 GB (``--quick``: about 40 s; the test's
``--quick --no-export``: about 15 s).
Memory: the dense Criteo tables are 2.2 GB; at most the dense tables, their int8 copy and the
export's copy live at once (about 6 GB), then the fused training tables with their Adagrad state.

    OMP_NUM_THREADS=1 WANDB_MODE=disabled .venv/bin/python -m benchmarks.inference.embedding_speed
        [--workloads criteo,movielens] [--batches 1,4096] [--rounds 7] [--warmup 2] [--zipf 1.2]
        [--train-batch 4096] [--count-batches 20] [--no-export] [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.inference import embedding_systems as systems
from benchmarks.inference.embedding_report import markdown
from benchmarks.inference.embedding_timing import calls_per_round, first_calls, time_inference, time_training
from benchmarks.inference.embedding_workloads import QUICK_MAX_ROWS, WORKLOADS, ZIPF_A, make_workload
from benchmarks.probes import RESULTS, command_line, machine_basics, release_free_memory, rss_peak, without_out

QUICK = {"rounds": 2, "warmup": 1, "batches": "1,128", "train_batch": 128, "count_batches": 2}


def log(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def measure_sizes(models: dict[str, Any], workload: Any, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Serving bytes (and how they were read), state_dict file sizes, export sizes, into ``result``."""
    serving = {name: systems.serving_bytes(systems.collection_of(m)) for name, m in models.items()}
    result["serving_bytes"] = {name: value for name, (value, _) in serving.items()}
    result["serving_bytes_source"] = {name: how for name, (_, how) in serving.items()}
    result["serving_dense_over"] = {name: result["serving_bytes"]["dense"] / value
                                    for name, value in result["serving_bytes"].items() if name != "dense" and value}
    result["mlp_bytes"] = systems.tensor_bytes(models["dense"]) - systems.tensor_bytes(systems.collection_of(models["dense"]))
    if args.no_export:
        return
    log("state_dict and export sizes ...")
    result["state_dict_bytes"] = {name: systems.state_dict_bytes(m) for name, m in models.items()}
    example = workload.batches(2, 1, seed=args.seed + 3)[0]
    result["export_bytes"] = {}
    for name in ("dense", "tt_before", "tt", "tt_pruned"):
        if name not in models:
            continue
        try:
            result["export_bytes"][name] = systems.export_bytes(models[name], example)
        except Exception as error:  # reported, not fatal: the timings stand without it
            result["export_bytes"][name] = f"failed: {type(error).__name__}: {error}"
        release_free_memory()


def run_inference(workload: Any, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Build, count, time the lookups and DLRMs, read the sizes; the models are freed on return."""
    log(f"{workload.name}: building the systems ...")
    models, result["unavailable"] = systems.build_inference(workload, args)
    counts = workload.batches(args.train_batch, args.count_batches, seed=args.seed, split="train")
    result["counted_with"] = {name: systems.count_ids(systems.collection_of(m), counts)
                              for name, m in models.items() if name.startswith("tt")}
    del counts
    result["first_call_ms"] = first_calls(models, lambda: workload.batches(1, 1, seed=args.seed + 2)[0])
    result["inference"] = {}
    for batch in args.batches:
        log(f"{workload.name}: inference at batch {batch} ...")
        count = (args.warmup + args.rounds) * calls_per_round(batch)
        result["inference"][str(batch)] = time_inference(models, lambda: workload.batches(batch, count, seed=args.seed + 1), args, batch)
    measure_sizes(models, workload, args, result)
    result["peak_rss_after_inference"] = rss_peak()


def run_training(workload: Any, args: argparse.Namespace, result: dict[str, Any]) -> None:
    log(f"{workload.name}: training steps at batch {args.train_batch} ...")
    trainers = systems.build_training(workload, args)
    result["train_batch"] = args.train_batch
    result["train"] = time_training(trainers, lambda: workload.batches(args.train_batch, args.warmup + args.rounds, seed=args.seed + 1), args)
    result["train_optimizers"] = {"dense": "FusedEmbeddingBagCollection EXACT_ADAGRAD (fbgemm) + torch.optim.Adagrad(fused=True) (MLPs)",
                                  **{n: "torch.optim.Adagrad(fused=True) (all parameters)" for n in trainers if n != "dense"}}


def run_workload(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every measure of one workload."""
    start = time.perf_counter()
    workload = make_workload(name, zipf_a=args.zipf, quick=args.quick)
    tt_tables = sum(size >= args.min_rows for size in workload.table_sizes)
    result: dict[str, Any] = {
        "note": workload.note, "table_sizes": workload.table_sizes, "num_dense": workload.num_dense,
        "tt_tables": tt_tables, "dense_tables_below_min_rows": len(workload.table_sizes) - tt_tables,
        "train_batch": args.train_batch,
    }
    run_inference(workload, args, result)
    release_free_memory()
    run_training(workload, args, result)
    release_free_memory()
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def host(args: argparse.Namespace) -> dict[str, Any]:
    """The machine and library versions, threads and date."""
    import importlib.metadata

    import torch

    versions = {}
    for package in ("torchrec", "fbgemm-gpu-cpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {**machine_basics(), "torch": torch.__version__, **versions, "threads": torch.get_num_threads(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--batches", default="1,4096", help="inference batch sizes")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--train-batch", type=int, default=4096)
    parser.add_argument("--count-batches", type=int, default=20, help="training batches the TT tables count ids of")
    parser.add_argument("--zipf", type=float, default=ZIPF_A, help="Zipf exponent of the Criteo ids")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--max-rank", type=int, default=32)
    parser.add_argument("--min-rows", type=int, default=1000, help="tables with fewer rows stay dense in TT")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-export", action="store_true", help="skip the state_dict and export file sizes")
    parser.add_argument("--quick", action="store_true", help=f"Criteo tables capped at {QUICK_MAX_ROWS:,} rows; {QUICK}")
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/embedding_speed[_quick].json")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    args.batches = [int(b) for b in str(args.batches).split(",")]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown or args.rounds < 1 or args.warmup < 1:
        parser.error(f"workloads from {WORKLOADS} (got {unknown}); --rounds and --warmup at least 1.")
    if args.out is None:
        args.out = RESULTS / f"embedding_speed{'_quick' if args.quick else ''}.json"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    report: dict[str, Any] = {"benchmark": "embedding_speed", "command": command_line(["-m", __spec__.name, *without_out(argv)]),
                              "host": host(args), "settings": {k: v for k, v in vars(args).items() if k != "out"},
                              "systems": list(systems.SYSTEMS), "workloads": {}}
    for name in args.workloads:
        report["workloads"][name] = run_workload(name, args)
    report["host"]["wall_s"] = round(time.perf_counter() - start, 1)
    report["markdown"] = markdown(report, systems.SYSTEMS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(report["markdown"])
    log(f"wrote {args.out} ({report['host']['wall_s']} s)")
    return report


if __name__ == "__main__":
    main()
