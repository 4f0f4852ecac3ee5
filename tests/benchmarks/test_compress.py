"""benchmarks/quality/compress: a tiny trained causal LM compressed by every system, from cached dense weights."""

import json

import pytest

from benchmarks.quality import compress


@pytest.mark.slow  # ~9 s alone: the default suite is at its 5-minute bar
def test_every_system_starts_from_the_trained_weights_and_the_plain_path_gets_comeras_ranks(tmp_path):
    out, cache = tmp_path / "compress.json", tmp_path / "cache"
    result = compress.main(["--check", "--compressions", "4", "--no-served", "--cache", str(cache), "--out", str(out)])
    assert json.loads(out.read_text()) == result and "cache" not in result["args"] and "out" not in result["args"]
    runs = result["by_compression"]["4"]
    assert set(runs) == {"comera", "svd", "svd_ft", "svd_ft_uniform", "asvd_ft", "fwsvd_ft", "kfac_ft", "svd_ft_measured",
                         "kfac_ft_measured", "prune_ft", "small"}
    assert result["dense_ft"]["steps"] == 4
    factored = {runs[s]["parameters"] for s in ("svd", "svd_ft", "asvd_ft", "fwsvd_ft", "kfac_ft")}
    assert len(factored) == 1 and factored.pop() < result["dense"]["parameters"]
    measured = runs["kfac_ft_measured"]  # ranks of its own, measured, at no more than CoMERA's size
    assert measured["ranks"] == runs["svd_ft_measured"]["ranks"] and measured["ranks"].keys() == runs["comera"]["ranks"].keys()
    assert measured["parameters"] == runs["svd_ft_measured"]["parameters"] <= runs["svd"]["parameters"] * 1.01
    assert abs(runs["prune_ft"]["parameters"] / runs["svd"]["parameters"] - 1) < 0.05, "pruned to the same weights (nonzeros)"
    assert abs(runs["svd"]["parameters"] / runs["comera"]["parameters"] - 1) < 0.05, "the same size as CoMERA's end"
    assert runs["comera"]["ranks"] and runs["small"]["width"] < 32
    uniform = runs["svd_ft_uniform"]  # one rank for every layer, at about CoMERA's size
    assert len(set(runs["comera"]["ranks"].values())) > 1 and uniform["rank"] >= 1
    assert abs(uniform["parameters"] / runs["svd_ft"]["parameters"] - 1) < 0.1
    assert len(list(cache.glob("*.pt"))) == 1 and "served" not in runs["comera"] and "served" not in result["dense"]
    again = compress.main(["--check", "--compressions", "4", "--systems", "comera,prune_ft", "--cache", str(cache),
                           "--out", str(tmp_path / "again.json")])
    assert {k: v for k, v in again["dense"].items() if k != "served"} == result["dense"], "the dense training comes from the cache"
    served = {name: run["served"] for name, run in again["by_compression"]["4"].items()}
    assert set(served) == {"comera", "prune_ft"} and again["dense"]["served"]["ms_batch32"] > 0
    assert served["comera"]["file_bytes"] < again["dense"]["served"]["file_bytes"] <= served["prune_ft"]["file_bytes"] * 1.01
    assert "| 4x |" in compress.table(again)
