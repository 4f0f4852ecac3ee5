"""The training-floor benchmarks run end to end (``--quick``: Criteo tables capped at 5,000 rows) and report every system."""

import pytest

pytest.importorskip("torchrec")

from benchmarks.inference import training_floor  # noqa: E402


def test_training_floor_times_dense_tt_and_each_floor(tmp_path):
    out = tmp_path / "floor.json"
    report = training_floor.main(["--quick", "--batch", "256", "--rounds", "2", "--warmup", "1", "--ranks", "8,2", "--out", str(out)])
    assert out.exists()
    assert list(report["ms_median"]) == ["dense", "tt", "floor_r8", "floor_r2"]
    assert all(ms > 0 for ms in report["ms_median"].values())
    assert set(report["dense_over_paired"]) == {"tt", "floor_r8", "floor_r2"}
    assert 15 * 50 < report["distinct_ids_per_step"] < 15 * 256  # 15 TT tables; Zipf ids repeat (1,574 here)


def test_the_floor_computes_two_core_rows_and_their_gradients():
    import torch

    floor = training_floor.TwoCoreFloor([1500, 5000], rank=4, seed=0)
    grads = []
    for n2, left, right in floor.cores:
        assert left.shape[0] * n2 >= 1500 and left.shape[1] == right.shape[1] == 16
        left.register_hook(lambda g: grads.append(g.abs().sum()))
    floor.step([torch.tensor([0, 7, 1499]), torch.tensor([3, 4999])])
    assert len(grads) == 2 and all(g > 0 for g in grads)
    assert all(left.grad is None for _, left, _ in floor.cores)  # freed after the step


@pytest.mark.slow
def test_the_native_floor_builds_equals_the_torch_floor_and_is_timed(tmp_path):
    """Compiles the C++ kernel (needs a compiler, ~45 s) and checks it against the torch floor."""
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    from benchmarks.inference import native_floor

    report = native_floor.main(["--quick", "--batch", "256", "--rounds", "2", "--warmup", "1", "--ranks", "8", "--out", str(tmp_path / "n.json")])
    assert report["max_difference_vs_torch"][8] < 1e-4
    assert list(report["ms_median"]) == ["dense", "torch_r8", "native_r8"] and all(ms > 0 for ms in report["ms_median"].values())
