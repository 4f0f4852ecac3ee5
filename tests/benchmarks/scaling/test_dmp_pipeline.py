"""TorchRec's TrainPipelineSparseDist takes our DLRM under DMP: it pipelines the sharded tables, same weights as the plain loop."""

import importlib

import pytest

pytest.importorskip("torchrec")


def test_pipeline_pipelines_our_sharded_tables_and_trains_like_the_plain_loop():
    bench = importlib.import_module("benchmarks.scaling.dmp_pipeline")
    result = bench.main(["--steps", "3", "--rounds", "1", "--batch", "64"])
    assert result["pipelined_modules"] == ["ShardedEmbeddingBagCollection"]
    assert result["max_weight_difference_after_equal_steps"] == 0.0
    assert all(v["median"] > 0 for v in result["rows_per_s"].values())
