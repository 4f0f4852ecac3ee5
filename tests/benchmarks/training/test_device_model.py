"""benchmarks/training/device_model.py: the fit recovers known constants, predicts ratios, and reads the recorded rows."""

import json

import numpy as np

from benchmarks.probes import ROOT
from benchmarks.training import device_model

TRUE = np.array([20e-6, 4e-6, 1 / 400e12, 1 / 3e12])  # s per kernel eager, captured; s per FLOP; s per byte


def _synthetic() -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(0)
    account, measured = [], []
    for i in range(4):
        for system in ("dense", "comera"):
            row = {"model": f"m{i}", "system": system, "kernels": float(rng.integers(500, 5000)),
                   "gemm_flops": float(rng.uniform(1e11, 5e12)), "other_bytes": float(rng.uniform(1e9, 5e10))}
            account.append(row)
            for mode in device_model.MODES:
                seconds = device_model.features(row, mode) @ TRUE
                measured.append({"model": row["model"], "system": system, "mode": mode, "steps_per_s": 1 / seconds})
    measured.append({"model": "m0", "system": "dense", "mode": "compiled", "steps_per_s": 1.0})  # not fitted
    return measured, account


def test_the_fit_recovers_the_constants_and_each_row_left_out():
    measured, account = _synthetic()
    coef, table = device_model.fit_rows(measured, account)
    np.testing.assert_allclose(coef, TRUE, rtol=1e-6)
    assert len(table) == 16 and all(abs(r["error"]) < 1e-6 and abs(r["left_out_error"]) < 1e-6 for r in table)
    constants = device_model.constants(coef)
    assert round(constants["kernel_us_eager"], 3) == 20.0 and round(constants["gemm_tflops"]) == 400


def test_predictions_are_ratios_to_dense_in_the_same_mode():
    measured, account = _synthetic()
    coef, _ = device_model.fit_rows(measured, account)
    rows = device_model.predict(coef, account)
    for row in rows:
        same = [m for m in measured if (m["model"], m["system"], m["mode"]) == (row["model"], row["system"], row["mode"])][0]
        assert abs(row["modeled_steps_per_s"] / same["steps_per_s"] - 1) < 1e-6
        assert (row["modeled_x_dense"] == 1.0) == (row["system"] == "dense")


def test_no_constant_is_fitted_below_zero():
    x = np.array([[1.0, 0.0, 1.0], [2.0, 0.0, 1.0], [3.0, 0.0, 1.0]])
    assert (device_model.fit(x, np.array([1.0, 1.5, 1.9])) >= 0).all()


def test_the_recorded_h200_rows_fit(tmp_path):
    out = tmp_path / "model.json"
    device_model.main(["--measured", str(ROOT / "benchmarks/results/h200/gpu_speed_2026-11-28.json"),
                       "--fit-account", str(ROOT / "benchmarks/results/h200/step_account_c7f9c21.json"), "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["fit"]) == 10 and result["device"] == "NVIDIA H200"
    assert result["constants"]["kernel_us_eager"] > result["constants"]["kernel_us_graphs"] > 0
    assert "Modeled, not measured" in out.with_suffix(".md").read_text()
