"""``dlrm_memory.py``'s results: the dense/TT ratios, the printed tables, docs/METHOD.md §3's claims, the machine."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.probes import GB, machine_basics


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
