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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import (
    GB,
    command_line,
    machine_basics,
    mem_available,
    module_command,
    print_result,
    release_free_memory,
    rss_now,
    rss_peak,
    spawn_measured,
)

SYSTEMS = ("dense", "tt", "tt_from_dense", "tt_from_meta")
OPTIMIZERS = ("adagrad", "sgd", "adamw")
# Optimizer state per parameter, in parameter-sized tensors (SGD without momentum keeps none).
STATE_TENSORS = {"sgd": 0, "adagrad": 1, "adamw": 2}
# Parameter-sized temporaries the single-tensor CPU step makes for one parameter at a time
# (Adagrad: sqrt(state) + eps; AdamW: sqrt(exp_avg_sq) then its division by the bias correction).
STEP_TEMPORARIES = {"sgd": 0, "adagrad": 1, "adamw": 2}
NUM_DENSE_FEATURES = 13


# ---- memory probes ------------------------------------------------------------------------------


# ---- the worker: one system, one dim, one process ---------------------------------------------


def make_batches(batch_size: int, count: int, seed: int) -> list[Any]:
    """``count`` synthetic Criteo batches (one Zipf-like id per feature) at the Kaggle cardinalities."""
    from comera_lightning.data.criteo import SyntheticCriteoDataModule

    dataset = SyntheticCriteoDataModule(batch_size=batch_size, num_batches=count, seed=seed).dataset("train")
    return [dataset[i] for i in range(count)]


def unique_fraction(batch: Any) -> float:
    """Mean over features of (distinct ids / ids) in one batch: how much deduplication can save."""
    import torch

    kjt = batch.sparse
    fractions = [torch.unique(v).numel() / max(1, v.numel()) for v in kjt.values().split(kjt.length_per_key())]
    return sum(fractions) / len(fractions)


def build_collection(system: str, dim: int, args: argparse.Namespace) -> Any:
    """The 26-table collection of ``system`` at embedding dim ``dim``."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from comera_lightning import TTEmbeddingBagCollection
    from comera_lightning.data.click_logs import embedding_bag_configs
    from comera_lightning.data.criteo import CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES

    configs = embedding_bag_configs(CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES, dim)
    tt_options = {"max_rank": args.max_rank, "num_cores": args.num_cores, "min_rows": args.min_rows}
    if system == "dense":
        return EmbeddingBagCollection(tables=configs)
    if system == "tt":
        return TTEmbeddingBagCollection(configs, **tt_options)
    dense = EmbeddingBagCollection(tables=configs, device="meta" if system == "tt_from_meta" else None)
    collection = TTEmbeddingBagCollection.from_ebc(dense, init="random", **tt_options)
    del dense
    return collection


def build_model(collection: Any, dim: int) -> Any:
    """TorchRec DLRM around ``collection``: dense arch 13-512-256-dim, over arch 512-256-1."""
    from torchrec.models.dlrm import DLRM

    return DLRM(
        embedding_bag_collection=collection,
        dense_in_features=NUM_DENSE_FEATURES,
        dense_arch_layer_sizes=[512, 256, dim],
        over_arch_layer_sizes=[512, 256, 1],
    )


def make_optimizer(name: str, params: Any, lr: float) -> Any:
    """The optimizer both systems use (torch defaults otherwise: single-tensor loops on CPU)."""
    import torch

    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def train_step(model: Any, optimizer: Any, batch: Any) -> float:
    """Forward, BCE-with-logits, backward, optimizer step, gradients freed; returns the loss."""
    import torch.nn.functional as F

    logits = model(dense_features=batch.dense, sparse_features=batch.sparse).squeeze(-1)
    loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


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


# ---- the parent: spawn workers, compute what cannot run, print and save ------------------------


def table_sizes() -> list[int]:
    """The 26 Criteo Kaggle cardinalities (imported without torch's cost in the parent mattering)."""
    from comera_lightning.data.criteo import CRITEO_KAGGLE_TABLE_SIZES

    return list(CRITEO_KAGGLE_TABLE_SIZES)


def dense_estimate(dim: int, optimizer: str, rss_import: int) -> dict[str, int]:
    """Analytic dense memory: import baseline + weights + state (+ gradient and one table's temporaries at peak)."""
    sizes = table_sizes()
    weights = sum(sizes) * dim * 4
    largest = max(sizes) * dim * 4
    model_state = rss_import + weights * (1 + STATE_TENSORS[optimizer])
    return {
        "rss_model_state": model_state,
        "peak": model_state + weights + STEP_TEMPORARIES[optimizer] * largest,
        "weights_bytes": weights,
    }


def spawn_worker(system: str, dim: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker subprocess: its measurements, or how it failed (out of memory included)."""
    command = [
        *module_command(__spec__.name), "--worker", system, "--worker-dim", str(dim),
        "--batch", str(args.batch), "--optimizer", args.optimizer, "--lr", str(args.lr),
        "--max-rank", str(args.max_rank), "--num-cores", str(args.num_cores), "--min-rows", str(args.min_rows),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
        "--seed", str(args.seed),
    ]
    return spawn_measured(command, f"{system} at dim {dim}", {"system": system, "dim": dim})


def run_dim(dim: int, args: argparse.Namespace, limit: int) -> dict[str, Any]:
    """TT system(s) first, then dense: measured when its predicted peak fits ``limit``, else computed."""
    rows: dict[str, Any] = {}
    for system in [s for s in args.systems if s != "dense"]:
        if system == "tt_from_dense" and dense_estimate(dim, "sgd", 0)["weights_bytes"] > limit:
            rows[system] = {"system": system, "dim": dim, "status": "skipped (dense tables exceed --max-gb)"}
            continue
        rows[system] = spawn_worker(system, dim, args)
    if "dense" not in args.systems:
        return rows
    baseline = next((r["rss_import"] for r in rows.values() if "rss_import" in r), 0)
    estimate = dense_estimate(dim, args.optimizer, baseline)
    if estimate["peak"] <= limit or args.force_dense:
        rows["dense"] = spawn_worker("dense", dim, args)
        rows["dense"]["computed_estimate"] = estimate
    else:
        dense_params = sum(table_sizes()) * dim
        tt = rows.get("tt", {})
        rows["dense"] = {
            "system": "dense", "dim": dim, "status": "computed", "rss_import": baseline,
            "rss_model_state": estimate["rss_model_state"], "peak": estimate["peak"],
            "params_embedding": dense_params, "params_embedding_dense_equivalent": dense_params,
            "note": f"predicted peak {estimate['peak'] / GB:.1f} GB > limit {limit / GB:.1f} GB: not run; "
                    "import RSS + weights + optimizer state + gradient + largest table's step temporaries",
        }
        if "params_model" in tt:  # same MLPs as the TT model
            rows["dense"]["params_model"] = tt["params_model"] - tt["params_embedding"] + dense_params
    return rows


def ratios(rows: dict[str, Any], tt_name: str = "tt") -> dict[str, float]:
    """Dense / TT ratios of parameters, memory (raw and net of the import baseline) and step time."""
    dense, tt = rows.get("dense", {}), rows.get(tt_name, {})
    if "peak" not in dense or "peak" not in tt:
        return {}
    out = {
        "embedding_compression": dense["params_embedding"] / tt["params_embedding"],
        "peak_rss": dense["peak"] / tt["peak"],
        "peak_rss_net_of_import": (dense["peak"] - dense["rss_import"]) / (tt["peak"] - tt["rss_import"]),
        "model_state_rss": dense["rss_model_state"] / tt["rss_model_state"],
        "model_state_rss_net_of_import": (dense["rss_model_state"] - dense["rss_import"])
        / max(1, tt["rss_model_state"] - tt["rss_import"]),
    }
    if "step_ms_median" in dense and "step_ms_median" in tt:
        out["step_time"] = dense["step_ms_median"] / tt["step_ms_median"]
    if "params_model" in dense and "params_model" in tt:
        out["model_compression"] = dense["params_model"] / tt["params_model"]
    return out


def print_table(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> None:
    """One row per (dim, system), then the dense/TT ratios per dim."""
    head = (f"{'dim':>4s} {'system':14s} {'status':9s} {'emb params':>13s} {'import GB':>9s} "
            f"{'model+state GB':>14s} {'peak GB':>8s} {'step work GB':>12s} {'step ms':>9s} {'min ms':>8s}")
    print(f"\nDLRM train step, batch {args.batch}, optimizer {args.optimizer}, TT max_rank {args.max_rank}, "
          f"{args.num_cores} cores per table, {args.threads} threads")
    print(head)
    print("-" * len(head))
    for dim, rows in results.items():
        for name, row in rows.items():
            if "peak" not in row:
                print(f"{dim:4d} {name:14s} {row['status']}")
                continue
            work = (row["peak"] - row["rss_model_state"]) / GB
            step = (f"{row['step_ms_median']:9.0f} {min(row['step_ms_all']):8.0f}" if "step_ms_median" in row
                    else f"{'n/a':>9s} {'n/a':>8s}")
            status = "measured" if row["status"] == "measured" else "COMPUTED"
            print(f"{dim:4d} {name:14s} {status:9s} {row['params_embedding']:13,d} {row['rss_import'] / GB:9.2f} "
                  f"{row['rss_model_state'] / GB:14.2f} {row['peak'] / GB:8.2f} {work:12.2f} {step}")
            if "computed_estimate" in row:
                est = row["computed_estimate"]
                print(f"{'':4s} {'  (formula)':14s} {'computed':9s} {'':13s} {'':9s} "
                      f"{est['rss_model_state'] / GB:14.2f} {est['peak'] / GB:8.2f}")
    print("\ndense / TT ratios (x):")
    print(f"{'dim':>4s} {'dense':9s} {'emb compr':>9s} {'model compr':>11s} {'peak':>7s} {'peak net':>8s} "
          f"{'model+state':>11s} {'m+s net':>8s} {'step time':>9s}")
    for dim, rows in results.items():
        r = ratios(rows)
        if not r:
            continue
        status = "measured" if rows["dense"]["status"] == "measured" else "COMPUTED"
        step = f"{r['step_time']:9.2f}" if "step_time" in r else f"{'n/a':>9s}"
        model = f"{r['model_compression']:11.1f}" if "model_compression" in r else f"{'n/a':>11s}"
        print(f"{dim:4d} {status:9s} {r['embedding_compression']:9.1f} {model} {r['peak_rss']:7.2f} "
              f"{r['peak_rss_net_of_import']:8.2f} {r['model_state_rss']:11.2f} "
              f"{r['model_state_rss_net_of_import']:8.1f} {step}")
    print("('net' = minus the import RSS both processes pay; 'step work' = peak - model+state; step time ratio\n"
          " from medians; the machine is shared, so times fluctuate while memory does not.)")


def check_claims(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """docs/METHOD.md §3: embedding compression >= 99x and peak memory >= 7x lower, per dim."""
    checks = {}
    for dim, rows in results.items():
        r = ratios(rows)
        if r:
            checks[dim] = {
                "compression_ge_99": r["embedding_compression"] >= 99,
                "peak_memory_ge_7": r["peak_rss"] >= 7,
                "peak_memory_net_ge_7": r["peak_rss_net_of_import"] >= 7,
                "dense_memory": rows["dense"]["status"],
            }
    print("\nclaims (docs/METHOD.md §3: 99x compression, 7x lower peak memory):")
    for dim, c in checks.items():
        print(f"  dim {dim}: compression>=99x {c['compression_ge_99']}, peak>=7x {c['peak_memory_ge_7']} "
              f"(net of import {c['peak_memory_net_ge_7']}), dense memory {c['dense_memory']}")
    return checks


def machine(results: dict[int, dict[str, Any]], threads: int) -> dict[str, Any]:
    """CPU model, cores, RAM, torch/torchrec versions (from a worker) and threads."""
    worker = next((r for rows in results.values() for r in rows.values() if "torch" in r), {})
    return {
        **machine_basics(),
        "torch": worker.get("torch", "unknown"),
        "torchrec": worker.get("torchrec", "unknown"),
        "threads": threads,
    }


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
