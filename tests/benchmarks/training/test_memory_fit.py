"""benchmarks/training/memory_fit.py: activation coefficients solved from account rows, exact parameter counts on the
meta device, and the largest shape that fits each budget."""

import numpy as np

from benchmarks.training import memory_fit
from benchmarks.training.gpu_runs import WORKLOADS

COEFFICIENTS = {"dense": (40.0, 6.0, 2.0), "comera": (36.0, 4.0, 2.0)}  # bytes per token: per width, per FFN (x blocks), per vocab


def _rows() -> list[dict]:
    rows = []
    for name in ("llama60m", "llama350m", "llama1b"):
        w = WORKLOADS[name]
        for system, (a, b, c) in COEFFICIENTS.items():
            per_token = w.layers * (a * w.width + b * w.ffn) + c * w.vocab
            rows.append({"model": name, "system": system, "batch": 32, "seq": 256, "saved_bytes": per_token * 32 * 256})
    return rows


def test_the_coefficients_are_solved_from_three_counted_shapes():
    for system, want in COEFFICIENTS.items():
        np.testing.assert_allclose(memory_fit.activation_coefficients(_rows(), system), want, rtol=1e-9)


def test_tensorized_shapes_hold_fewer_parameters_and_fit_larger_models(monkeypatch):
    monkeypatch.setattr(memory_fit, "SHAPES", {"tiny": (256, 2, 688), "small": (512, 4, 1376)})
    rows = memory_fit.table(_rows(), 2048)
    by = {(r["shape"], r["system"]): r for r in rows}
    for shape in ("tiny", "small"):
        assert by[shape, "comera-8x"]["parameters"] < by[shape, "comera-4x"]["parameters"] < by[shape, "dense"]["parameters"]
        assert by[shape, "dense"]["state_gib"] == by[shape, "dense"]["parameters"] * 16 / 2**30
    monkeypatch.setattr(memory_fit, "BUDGETS_GIB", (by["small", "comera-4x"]["floor_gib"] * 1.001,))
    fits = next(iter(memory_fit.largest(rows).values()))
    assert fits == {"dense": "tiny", "comera-4x": "small", "comera-8x": "small"}
