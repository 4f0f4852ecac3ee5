"""benchmarks/training/gpu_profile.py: refuses without CUDA; ``--check`` profiles real fits on CPU and its sums add up."""

import json

import pytest

from benchmarks.training import gpu_profile


def test_without_cuda_it_refuses(monkeypatch):
    monkeypatch.setattr(gpu_profile.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_profile.main(["--models", "llama60m"])


def test_check_profiles_dense_and_comera_and_the_kinds_add_up(tmp_path):
    out = tmp_path / "profile.json"
    gpu_profile.main(["--check", "--models", "llama60m", "--steps", "1", "--warmup", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    runs = {r["system"]: r for r in result["runs"]}
    assert set(runs) == {"dense", "comera"}
    for run in runs.values():
        assert run["kernels_per_step"] == pytest.approx(sum(k["kernels"] for k in run["by_kind"].values()))
        assert run["device_ms_per_step"] == pytest.approx(sum(k["ms"] for k in run["by_kind"].values()))
        assert run["by_kind"]["gemm"]["kernels"] > 0 and run["top"]
    assert runs["comera"]["kernels_per_step"] > runs["dense"]["kernels_per_step"]  # the gates, the two-factor layers
    assert "| llama60m | comera |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(("name", "kind"), [("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
                                            ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>", "gemm"),
                                            ("_backward", "triton"),
                                            ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16>", "reduce"),
                                            ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda", "copy")])
def test_kernel_names_from_the_h200_fall_in_their_kinds(name, kind):
    assert gpu_profile.kind_of(name) == kind
