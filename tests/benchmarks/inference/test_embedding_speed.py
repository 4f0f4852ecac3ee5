"""benchmarks/inference/embedding_speed.py --quick: every system of both workloads is timed, sized and reported."""

import importlib
import json

import pytest
import torch

pytest.importorskip("torchrec")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("embedding_speed") / "embedding_speed.json"
    bench = importlib.import_module("benchmarks.inference.embedding_speed")
    threads = torch.get_num_threads()
    try:
        bench.main(["--quick", "--no-export", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text())


def test_every_system_is_timed_or_says_why_not(report):
    systems = report["systems"]
    assert systems == ["dense", "int8", "tt_before", "tt", "tt_pruned"]
    assert set(report["workloads"]) == {"criteo", "movielens"}
    for name, result in report["workloads"].items():
        present = [s for s in systems if s not in result["unavailable"]]
        assert present == systems, (name, result["unavailable"])
        for batch, measures in result["inference"].items():
            for measure in ("lookup", "dlrm"):
                medians = measures[measure]["ms_median"]
                assert set(medians) == set(present) and all(ms > 0 for ms in medians.values()), (name, batch, measure)
                assert all(len(t) == report["settings"]["rounds"] for t in measures[measure]["ms_rounds"].values())
                assert set(measures[measure]["dense_over"]) == set(measures[measure]["dense_over_paired"]) == set(present) - {"dense"}
                rounds = measures[measure]["ms_rounds"]
                paired = sorted(d / t for d, t in zip(rounds["dense"], rounds["tt"]))
                assert paired[0] <= measures[measure]["dense_over_paired"]["tt"] <= paired[-1]
        trained = set(result["train"]["ms_median"])
        assert trained == set(present) - {"int8", "tt_pruned"} and all(ms > 0 for ms in result["train"]["ms_median"].values())
        assert all(b > 0 for b in result["serving_bytes"].values()) and set(result["serving_bytes"]) == set(present)


def test_the_tables_are_smaller_than_dense_and_the_report_is_markdown(report):
    criteo = report["workloads"]["criteo"]
    assert criteo["serving_dense_over"]["int8"] > 1.5  # one int8 byte per value plus a scale and bias per row
    assert criteo["serving_dense_over"]["tt_before"] > 1
    assert report["markdown"].count("| dense |") == 2 and "--out" not in report["command"]
    assert report["host"]["threads"] == 1 and report["host"]["torch"] == torch.__version__
