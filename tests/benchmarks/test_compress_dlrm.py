"""benchmarks/quality/compress_dlrm: a trained DLRM's tables compressed end to end on a few MovieLens batches."""

import json

import pytest
import torch

pytest.importorskip("torchrec")

from benchmarks.quality import compress_dlrm


def test_a_low_rank_bag_is_the_bag_at_full_rank():
    bag = torch.nn.EmbeddingBag(50, 6, mode="sum", include_last_offset=True, dtype=torch.float64)
    ids, offsets = torch.tensor([3, 7, 7, 49, 0]), torch.tensor([0, 2, 2, 5])
    low = compress_dlrm.LowRankEmbeddingBag(bag, rank=6)
    torch.testing.assert_close(low(ids, offsets).double(), bag(ids, offsets), atol=1e-5, rtol=0)
    assert [p.shape for p in low.cores] == [(50, 6), (6, 6)]
    rows = compress_dlrm.FactorRows(low)(torch.tensor([[3, 7], [49, 0]]))  # what its exported program looks up
    torch.testing.assert_close(rows.double(), bag.weight[torch.tensor([[3, 7], [49, 0]])], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_each_system_is_served_as_an_exported_program(tmp_path):
    result = compress_dlrm.main(["--check", "--systems", "comera,svd_ft", "--cache", str(tmp_path / "cache"),
                                 "--out", str(tmp_path / "dlrm.json")])
    runs = result["by_compression"]["8"]
    assert all(run["served"]["file_bytes"] < result["dense"]["served"]["file_bytes"] for run in runs.values())
    assert all(run["served"]["ms_batch32"] > 0 for run in runs.values())


def test_every_system_compresses_the_same_tables_from_the_trained_weights(tmp_path):
    out = tmp_path / "dlrm.json"
    result = compress_dlrm.main(["--check", "--no-served", "--cache", str(tmp_path / "cache"), "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["dense_steps"] == 4 and result["extra_steps"] == 1 and result["dense_ft"]["steps"] == 1
    runs = result["by_compression"]["8"]
    assert set(runs) == {"comera", "svd_ft", "svd_ft_uniform", "prune_ft", "small"}
    dense_tables = result["dense"]["table_parameters"]
    assert all(run["table_parameters"] < dense_tables for run in runs.values())
    assert runs["prune_ft"]["table_parameters"] == runs["comera"]["table_parameters"], "pruned to CoMERA's count"
    assert abs(runs["svd_ft"]["table_parameters"] / runs["comera"]["table_parameters"] - 1) < 0.1
    assert set(runs["svd_ft"]["ranks"]) == set(runs["comera"]["sizes"]) == {"t_user_id", "t_item_id", "t_zip_code"}
    uniform = runs["svd_ft_uniform"]  # one rank for the three tables, at about CoMERA's size
    assert uniform["rank"] >= 1 and abs(uniform["table_parameters"] / runs["comera"]["table_parameters"] - 1) < 0.1
    assert runs["small"]["embedding_dim"] < compress_dlrm.MODEL["embedding_dim"] and runs["small"]["steps"] == 5
    assert "--out" not in result["command"] and "--cache" not in result["command"]
    assert "| 8× |" in compress_dlrm.table(result)


def test_the_plain_path_with_a_teacher_is_run_only_when_named_and_given_one(capsys):
    with pytest.raises(SystemExit):
        compress_dlrm.main(["--check", "--systems", "comera,svd_ft_distill"])
    assert "give it as --callback 'distill={...}'" in capsys.readouterr().err
    assert "svd_ft_distill" not in compress_dlrm.parse_args(["--check"])[1], "not among the defaults"


def test_a_width_that_is_not_positive_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        compress_dlrm.parse_args(["--check", "--embedding-dim", "0"])
    assert "--embedding-dim must be a positive width, got 0" in capsys.readouterr().err


def test_a_wider_dlrm_is_trained_and_compressed_at_its_own_width(tmp_path):
    result = compress_dlrm.main(["--check", "--no-served", "--embedding-dim", "32", "--systems", "comera,svd_ft,small",
                                 "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "dlrm.json")])
    assert result["model"]["embedding_dim"] == 32 and result["model"]["dense_arch_layer_sizes"] == [64, 32]
    assert result["dense"]["embedding_dim"] == 32 and result["dense"]["table_parameters"] == 2 * 47_600
    runs = result["by_compression"]["8"]
    assert runs["comera"]["embedding_dim"] == runs["svd_ft"]["embedding_dim"] == 32
    assert runs["small"]["embedding_dim"] < 32, "a narrower model holding about CoMERA's table size"
    assert max(runs["svd_ft"]["ranks"].values()) > 1, "at 8x a 32-wide table keeps more than rank 1"
    narrow = compress_dlrm.main(["--check", "--no-served", "--systems", "comera", "--cache", str(tmp_path / "cache"),
                                 "--out", str(tmp_path / "d16.json")])
    assert narrow["dense"]["embedding_dim"] == 16 and len(list((tmp_path / "cache").iterdir())) == 2, "each width its own"
