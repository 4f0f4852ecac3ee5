"""A device model: a training step's time on a GPU predicted from its step account. Modeled, never measured.

    t(step) = kernels × c[mode] + GEMM FLOPs / R + other bytes / W

``c[mode]``: what one kernel costs beyond its work, eagerly (launch, dispatch, Python) and captured in a CUDA graph;
``R``: the GEMM rate; ``W``: the bandwidth the other kernels see. The four constants are fitted on the rows a device
measured (``gpu_speed.py``'s JSON, eager and graphs rows; compiled rows fuse kernels the account cannot see), each
row's account counted with the code that ran there at the run's batch and precision (``step_account.py --at-batch
--precision``), by least squares on relative error (no constant below zero). Each fitted row is shown with its
error when fitted with every row and when left out of the fit. The fitted model then predicts the step of any other
account (the current code, other shapes): the tables say "modeled", and they guide work between device sessions.

    python -m benchmarks.training.device_model --measured benchmarks/results/h200/gpu_speed_2026-11-28.json \\
        --fit-account benchmarks/results/h200/step_account_fit.json --predict-account benchmarks/results/step_account.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.probes import today, write_result

MODES = ("eager", "graphs")
CONSTANTS = ("kernel_us_eager", "kernel_us_graphs", "gemm_tflops", "other_tb_per_s")


def features(row: dict[str, Any], mode: str) -> np.ndarray:
    """The account's row as the model's inputs for ``mode``: kernels in that mode's column, FLOPs, bytes."""
    kernels = [row["kernels"] if mode == m else 0.0 for m in MODES]
    return np.array([*kernels, row["gemm_flops"], row["other_bytes"]], dtype=float)


def fit(x: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: coefficients (s per kernel eager, graphs, s per FLOP, per byte)."""
    scaled, target = x / seconds[:, None], np.ones(len(seconds))
    free = np.ones(x.shape[1], dtype=bool)
    while True:  # a small active set: drop the most negative coefficient and refit until none is below zero
        coef = np.zeros(x.shape[1])
        coef[free] = np.linalg.lstsq(scaled[:, free], target, rcond=None)[0]
        if (coef >= 0).all():
            return coef
        free[np.argmin(coef)] = False


def constants(coef: np.ndarray) -> dict[str, float]:
    """The coefficients in the units one reads: µs per kernel, TFLOP/s, TB/s."""
    rate = lambda c: 1 / c / 1e12 if c > 0 else float("inf")  # noqa: E731
    return {"kernel_us_eager": coef[0] * 1e6, "kernel_us_graphs": coef[1] * 1e6, "gemm_tflops": rate(coef[2]),
            "other_tb_per_s": rate(coef[3])}


def fit_rows(measured: list[dict[str, Any]], account: list[dict[str, Any]]) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The coefficients fitted on every measured eager/graphs row that has an account, and each row's errors."""
    counted = {(r["model"], r["system"]): r for r in account}
    rows = [r for r in measured if r.get("mode") in MODES and r.get("steps_per_s") and (r["model"], r["system"]) in counted]
    if len(rows) < 5:
        raise SystemExit(f"device_model: {len(rows)} measured rows have an account; the fit needs at least 5")
    x = np.stack([features(counted[r["model"], r["system"]], r["mode"]) for r in rows])
    seconds = np.array([1 / r["steps_per_s"] for r in rows])
    coef = fit(x, seconds)
    table = []
    for i, r in enumerate(rows):
        others = np.arange(len(rows)) != i
        left_out = fit(x[others], seconds[others])
        table.append({"model": r["model"], "system": r["system"], "mode": r["mode"], "measured_steps_per_s": r["steps_per_s"],
                      "fitted_steps_per_s": 1 / float(x[i] @ coef), "error": float(seconds[i] / (x[i] @ coef) - 1),
                      "left_out_error": float(seconds[i] / (x[i] @ left_out) - 1)})
    return coef, table


def predict(coef: np.ndarray, account: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Modeled steps/s of every account row in each mode, and over dense of the same model in the same mode."""
    rows = [{"model": r["model"], "system": r["system"], "mode": mode, "counted": r.get("counted", ""),
             "modeled_steps_per_s": 1 / float(features(r, mode) @ coef)} for r in account for mode in MODES]
    dense = {(r["model"], r["mode"]): r["modeled_steps_per_s"] for r in rows if r["system"] == "dense"}
    for r in rows:
        base = dense.get((r["model"], r["mode"]))
        r["modeled_x_dense"] = r["modeled_steps_per_s"] / base if base else None
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The constants, the fitted rows with their errors, the predictions: every figure labelled modeled."""
    c = result["constants"]
    accounts = result["fit_account"] if isinstance(result["fit_account"], list) else [result["fit_account"]]
    lines = [f"Device model fitted on `{result['measured']}` ({result['device']}; accounts "
             f"{', '.join(f'`{a}`' for a in accounts)}). "
             "**Modeled, not measured.**", "",
             f"Constants: {c['kernel_us_eager']:.2f} µs per kernel eager, {c['kernel_us_graphs']:.2f} µs captured, GEMMs at "
             f"{c['gemm_tflops']:,.0f} TFLOP/s, other kernels at {c['other_tb_per_s']:,.2f} TB/s.", "",
             "| model | system | mode | measured steps/s | fitted | fitted / measured − 1 | the same, row left out of the fit |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['system']} | {r['mode']} | {r['measured_steps_per_s']:.2f} | {r['fitted_steps_per_s']:.2f} | "
              f"{r['error']:+.0%} | {r['left_out_error']:+.0%} |" for r in result["fit"]]
    if result.get("predicted"):
        lines += ["", f"Modeled from {', '.join(f'`{p}`' for p in result['predict_account'])}:", "",
                  "| model | system | mode | modeled steps/s | modeled × dense | counted |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['system']} | {r['mode']} | {r['modeled_steps_per_s']:.2f} | "
                  f"{'-' if r['modeled_x_dense'] is None else format(r['modeled_x_dense'], '.2f')} | {r['counted']} |"
                  for r in result["predicted"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", required=True, help="gpu_speed.py's JSON from a device run")
    parser.add_argument("--fit-account", nargs="+", required=True,
                        help="step_account.py's JSONs of the code that ran there, same batch (their rows together)")
    parser.add_argument("--predict-account", nargs="+", default=None, help="step_account.py's JSONs to predict")
    parser.add_argument("--out", default=None, help="JSON path (a markdown table beside it)")
    args = parser.parse_args(argv)
    measured = json.loads(Path(args.measured).read_text())
    coef, table = fit_rows(measured["runs"], [r for path in args.fit_account for r in json.loads(Path(path).read_text())["rows"]])
    result = {"date": today(), "measured": args.measured, "fit_account": args.fit_account, "predict_account": args.predict_account,
              "device": measured["machine"].get("device", "?"), "constants": constants(coef), "fit": table,
              "predicted": predict(coef, [r for path in args.predict_account or [] for r in json.loads(Path(path).read_text())["rows"]])}
    write_result(args.out, result, markdown(result))
    return result


if __name__ == "__main__":
    main()
