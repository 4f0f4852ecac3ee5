"""benchmarks/scaling/fsdp_memory.py on a 1-layer paper Transformer and a tiny batch: the figures FSDP's refusal rests on."""

import importlib
import json

import pytest

SMALL = ["--layers", "1", "--batch", "2", "--seq", "16"]


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.scaling.fsdp_memory")


@pytest.fixture(scope="module")
def run(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "fsdp_memory.json"
    returned = bench.main([*SMALL, "--out", str(out)])
    return returned, json.loads(out.read_text()), str(out)


def test_json_has_every_figure_and_no_paths(run):
    returned, written, out = run
    assert written == json.loads(json.dumps(returned))
    assert set(written["host"]) >= {"cpu", "logical_cpus", "torch"}
    assert out not in json.dumps(written) and "/" not in json.dumps(written["config"])
    for kind in ("dense", "tensorized"):
        row = written["models"][kind]
        for key in ("param_bytes", "grad_bytes", "adamw_state_bytes", "came_state_bytes", "activation_bytes",
                    "activation_bytes_fixed", "activation_bytes_per_sample", "activation_bytes_profiler"):
            assert key in row, (kind, key)
        for name in ("adamw", "came"):
            assert set(row["fsdp"][name]) >= {"total_bytes", "saved_fraction_n2", "saved_fraction_n8"}


def test_measured_bytes_are_consistent(run):
    models = run[1]["models"]
    dense, tt = models["dense"], models["tensorized"]
    assert tt["param_bytes"] < dense["param_bytes"] / 10
    for row in (dense, tt):
        assert row["activation_bytes"] > 0 and row["activation_storages"] > 0
        assert row["grad_bytes"] == row["param_bytes"]  # every parameter gets a float32 gradient
        assert row["adamw_state_bytes"] >= 2 * row["param_bytes"]  # two moments (+ step counters)
        assert 0 < row["came_state_bytes"] < row["adamw_state_bytes"]
        assert row["activation_bytes"] > row["activation_bytes_batch1"]  # batch 2 saves more than batch 1
    assert tt["activation_bytes_fixed"] > 0  # the TT contractions are saved whatever the batch
    for row in (dense, tt):  # the profiler sees the same bytes left alive by the forward (the batch aside)
        assert row["activation_bytes_profiler"] == pytest.approx(row["activation_bytes"], rel=0.05)


def test_fsdp_fraction_follows_from_the_bytes(run, bench):
    row = run[1]["models"]["tensorized"]
    shardable = row["param_bytes"] + row["grad_bytes"] + row["adamw_state_bytes"]
    expected = shardable * (1 - 1 / 8) / (shardable + row["activation_bytes"])
    assert row["fsdp"]["adamw"]["saved_fraction_n8"] == pytest.approx(expected)
    dense = run[1]["models"]["dense"]
    assert row["fsdp"]["adamw"]["saved_fraction_n8"] < dense["fsdp"]["adamw"]["saved_fraction_n8"]


def test_bad_arguments_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--seq", "129"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--layers", "0"])
