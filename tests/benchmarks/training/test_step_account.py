"""benchmarks/training/step_account.py: the step account runs on CPU, its phases add up, and CoMERA's per-step
bookkeeping costs the same few kernels however many TT layers the model has."""

import argparse
import json
from dataclasses import replace

import pytest
import torch

from benchmarks.training import step_account
from benchmarks.training.gpu_runs import CHECK_WORKLOADS


def _args(**changes):
    args = argparse.Namespace(check=True, warmup=2, steps=1, precision="32-true", batch=1, at_batch=None, seq=None)
    return argparse.Namespace(**{**vars(args), **changes})


def test_check_counts_every_system_and_the_phases_add_up(tmp_path):
    out = tmp_path / "account.json"
    step_account.main(["--check", "--steps", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["system"]) for r in rows] == [
        (model, system) for model in ("llama60m", "transformer") for system in ("dense", "comera", "comera-end", "comera-paper")
        if model == "transformer" or system != "comera-paper"]
    for row in rows:
        assert row["kernels"] == sum(row["kernels_by_phase"].values()) > 0
        assert (row["kernels_by_phase"]["callback"] == 0) == (row["system"] == "dense")
        assert row["gemm_flops"] > 0 and row["saved_bytes"] > 0 and row["floor_bytes"] > row["parameter_bytes"] > 0
        assert row["x_dense"]["kernels"] >= 1.0 and row["x_dense"]["parameter_bytes"] <= 1.0
    assert out.with_suffix(".md").read_text().count("\n| transformer |") == 4
    by_system = {(r["model"], r["system"]): r for r in rows}
    assert by_system["llama60m", "comera-end"]["parameters"] < by_system["llama60m", "comera"]["parameters"]


def test_token_tables_are_counted_through_the_whole_table_or_the_torch_path(tmp_path):
    """The account's default counts a GPU's route (one GEMM builds the table); ``--lookups torch`` the CPU's; dense alike."""
    rows = {}
    for route in step_account.LOOKUP_ROUTES:
        out = tmp_path / f"{route}.json"
        step_account.main(["--check", "--models", "llama60m", "--systems", "dense,comera", "--steps", "1", "--lookups", route,
                           "--out", str(out)])
        rows[route] = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
        said = "through the whole table" if route == "whole-table" else "by the torch path"
        assert f"token tables {said}" in out.with_suffix(".md").read_text()
    whole, torch_path = rows["whole-table"], rows["torch"]
    assert whole["dense"]["gemm_flops"] == torch_path["dense"]["gemm_flops"]
    assert whole["comera"]["gemm_flops"] != torch_path["comera"]["gemm_flops"]
    assert whole["comera"]["kernels_by_phase"]["backward"] < torch_path["comera"]["kernels_by_phase"]["backward"]  # no recompute


def test_the_callbacks_step_work_does_not_grow_with_the_layers():
    """Masks latched once for all layers, the size terms in bulk: twice the blocks, the same callback kernels; and each
    added block costs CoMERA at most 1.4 times what it costs dense (three gated two-factor MLP layers per block)."""
    shallow, deep = (replace(CHECK_WORKLOADS["llama60m"], layers=n) for n in (2, 4))
    counts = {(system, w.layers): step_account.count_run(w, system, _args()) for system in ("dense", "comera") for w in (shallow, deep)}
    callback = [counts["comera", n]["kernels_by_phase"]["callback"] for n in (2, 4)]
    assert callback[0] == callback[1] and 0 < callback[0] < 80
    per_block = {s: (counts[s, 4]["kernels"] - counts[s, 2]["kernels"]) / 2 for s in ("dense", "comera")}
    assert per_block["comera"] <= 1.4 * per_block["dense"], per_block


def test_extension_is_the_line_through_two_counts():
    a = {"kernels": 10, "gemm_flops": 100.0, "nested": {"x": 1}, "name": "a"}
    b = {"kernels": 10, "gemm_flops": 160.0, "nested": {"x": 3}, "name": "b"}
    assert step_account.extended(a, b, 1, 2, 32, keep=("kernels",)) == {"kernels": 10, "gemm_flops": 100.0 + 31 * 60,
                                                                        "nested": {"x": 63}, "name": "b"}


def test_unknown_models_are_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        step_account.parse(["--models", "llama7b"])
    assert "unknown ['llama7b']" in capsys.readouterr().err


@pytest.mark.parametrize(("rank", "misaligned"), [(222, True), (224, False)])
def test_gemm_flops_on_rows_a_gpu_cannot_read_whole_are_counted_apart(rank, misaligned):
    from benchmarks.training.op_tally import OpTally

    left, right = torch.randn(16, rank, dtype=torch.bfloat16), torch.randn(rank, 64, dtype=torch.bfloat16)
    tally = OpTally()
    with tally:
        tally.counting = True
        left @ right
        left[:, 1:9] @ right[1:9]  # an offset of one element: never aligned
    count = tally.counts["loop"]
    offset_flops = 2 * 16 * 8 * 64
    assert count.gemm_flops == 2 * 16 * rank * 64 + offset_flops
    assert count.misaligned_gemm_flops == (count.gemm_flops if misaligned else offset_flops)
