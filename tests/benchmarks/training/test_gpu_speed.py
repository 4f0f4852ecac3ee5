"""benchmarks/training/gpu_speed.py (``make bench-gpu``): one line and exit 1 without CUDA; ``--check`` runs its code on CPU."""

import importlib
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.training.gpu_speed")


def test_without_cuda_it_refuses_in_one_line(bench):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.training.gpu_speed"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip() == bench.NO_CUDA and "\n" not in done.stderr.strip() and not done.stdout


@pytest.mark.parametrize("argv", [["--models", "llama60m", "--precisions", "bf16-mixed"],
                                  ["--models", "transformer", "--modes", "eager,graphs", "--precisions", "32-true"]],
                         ids=["llama-every-mode", "transformer-every-system"])
def test_check_runs_every_row_on_cpu(bench, tmp_path, argv):
    out = tmp_path / "gpu_speed.json"
    bench.main(["--check", *argv, "--out", str(out)])
    result = json.loads(out.read_text())
    args = bench.parse(["--check", *argv])
    assert len(result["runs"]) == len(bench.plan(args)) and all(r["steps"] == 2 for r in result["runs"])
    for row in result["runs"]:
        assert row["steps_per_s"] > 0 and row["tokens_per_s"] > 0 and (row["x_eager"] is None) == (row["mode"] == "batch1"), row
        assert row["batch"] == (1 if row["mode"] == "batch1" else 2), row
        if row["mode"] == "graphs":
            assert row["note"].startswith("graphs off: no CUDA"), row
    systems = {r["system"] for r in result["runs"]}
    assert systems == ({"dense", "comera"} if "llama60m" in argv else {"dense", "comera", "comera-paper"})
    lookup = result["lookup"]
    assert set(lookup["ms"]) == {f"{who} {what}" for who in ("dense", "tt") for what in ("train", "serve")} | {
        "tt train, torch path", "tt train, whole table", "tt serve, no cache", "tt serve, no cache, torch path"}
    assert not lookup["fused_kernel"] and lookup["tt_parameters"] < lookup["dense_parameters"]
    assert set(result["token_lookup"]["ms"]) == {"nn.Embedding", "whole table", "torch path"}  # (the kernel: CUDA only)
    table = out.with_suffix(".md").read_text()
    assert "cpu (--check)" in table and table.count("\n| llama60m |" if "llama60m" in argv else "\n| transformer |") == len(result["runs"])


def test_the_plan_runs_cheap_rows_first_and_budget_skips_the_rest(bench):
    args = bench.parse(["--check", "--models", "llama60m", "--budget", "0"])
    order = [row[2] for row in bench.plan(args)]
    assert order.index("compiled") > max(i for i, mode in enumerate(order) if mode != "compiled")
    rows = bench.run_all(args, started=0.0)
    assert rows and all(r["note"].startswith("not run: past the 0 s budget") for r in rows)


def test_unknown_names_are_refused_with_the_choices(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--models", "llama7b"])
    assert "unknown ['llama7b']; choose among ['llama60m', 'transformer', 'llama130m', 'llama350m', 'llama1b']" in capsys.readouterr().err



def test_a_failing_run_is_a_row_saying_why_and_the_others_still_run(bench, monkeypatch):
    calls = []

    def fit(workload, system, mode, precision, args):  # a GPU run that fails (CUDA out of memory, a kernel ...)
        calls.append(system)
        if system == "comera":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return {"model": workload.name, "system": system, "mode": mode, "precision": precision, "steps_per_s": 1.0}

    monkeypatch.setattr(bench, "timed_fit", fit)
    args = bench.parse(["--models", "llama60m", "--modes", "eager", "--precisions", "32-true"])
    rows = bench.run_all(args, started=float("inf"))  # (a start in the future: never past the budget)
    assert calls == ["dense", "comera"]
    assert rows[1]["note"] == "failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" and rows[0]["steps_per_s"] == 1.0


def test_compiled_rows_compile_the_networks_not_the_metrics():
    """A compiled torchmetrics ``Metric`` recompiled at every step (its update count is a guarded integer)."""
    from benchmarks.training.gpu_runs import CHECK_WORKLOADS, CompileNetworks, build_module

    module = build_module(CHECK_WORKLOADS["transformer"])
    CompileNetworks("aot_eager").on_fit_start(None, module)
    compiled = {name for name, child in module.named_children() if child._compiled_call_impl is not None}
    assert compiled == {"backbone", "pooler", "classifier"}
