"""benchmarks/training/token_lookup.py: every route that runs on CPU, timed and counted; the counts are the routes' FLOPs."""

import json

from benchmarks.training import token_lookup


def test_check_times_and_counts_each_route_on_cpu(tmp_path):
    out = tmp_path / "token_lookup.json"
    token_lookup.main(["--check", "--out", str(out)])
    result = json.loads(out.read_text())["lookup"]
    n_left, m_left, rank, n_right, m_right = result["factors"]
    assert list(result["ms"]) == ["nn.Embedding", "whole table", "torch path"]  # the per-id kernel runs on CUDA only
    assert all(ms > 0 for ms in result["ms"].values()) and result["over_kernel"] is None
    counts = result["counts"]
    width, ids = m_left * m_right, result["ids"]
    assert counts["whole table"]["gemm_flops"] == 3 * 2 * n_left * n_right * width * rank  # the table and its two gradients
    assert counts["torch path"]["gemm_flops"] == result["per_id_kernel"]["gemm_flops"] == 3 * 2 * ids * width * rank
    assert counts["nn.Embedding"]["gemm_flops"] == 0 and counts["nn.Embedding"]["kernels"] < counts["whole table"]["kernels"]
    assert result["per_id_kernel"]["atomic_adds"] == ids * (m_left + m_right) * rank
    assert (tmp_path / "token_lookup.md").read_text().count("| whole table |") == 1
