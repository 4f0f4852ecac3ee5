"""``dlrm_memory.py``'s runs of one dim: the TT workers, then the dense one, or its memory computed where it would not fit."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.probes import GB
from benchmarks.training.dlrm_worker import spawn_worker

# Optimizer state per parameter, in parameter-sized tensors (SGD without momentum keeps none).
STATE_TENSORS = {"sgd": 0, "adagrad": 1, "adamw": 2}
# Parameter-sized temporaries the single-tensor CPU step makes for one parameter at a time
# (Adagrad: sqrt(state) + eps; AdamW: sqrt(exp_avg_sq) then its division by the bias correction).
STEP_TEMPORARIES = {"sgd": 0, "adagrad": 1, "adamw": 2}


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
