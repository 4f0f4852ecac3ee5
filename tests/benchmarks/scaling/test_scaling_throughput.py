"""benchmarks/scaling/throughput.py: the timer counts samples over ranks; the whole benchmark runs (slow)."""

import importlib
import json

import pytest


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.scaling.throughput")


def test_commands_name_the_layout_threads_and_strategy(bench, tmp_path):
    one = bench.fit_command("transformer_tiny", "1p x 2t", 20, 5, tmp_path / "a.json")
    two = bench.fit_command("dlrm_tiny", "2p x 1t", 20, 5, tmp_path / "b.json")
    assert one[one.index("--threads") + 1] == "2" and "--trainer.strategy" not in one
    assert two[two.index("--trainer.devices") + 1] == "2" and two[two.index("--trainer.strategy") + 1] == "torchrec_dmp"
    timer = json.loads(two[two.index("--trainer.callbacks+") + 1])
    assert timer["init_args"] == {"out": str(tmp_path / "b.json"), "warmup": 5}


def test_too_few_batches_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.main(["--batches", "5", "--warmup", "5"])


@pytest.mark.slow
def test_transformer_runs_in_every_layout(bench, tmp_path):
    out = tmp_path / "scaling.json"
    result = bench.main(["--configs", "transformer_tiny", "--batches", "8", "--warmup", "3", "--rounds", "1",
                         "--out", str(out)])
    rates = result["workloads"]["transformer_tiny"]["samples_per_s"]
    assert set(rates) == {"1p x 1t", "1p x 2t", "2p x 1t"} and all(r["median"] > 0 for r in rates.values())
    assert str(tmp_path) not in out.read_text()
