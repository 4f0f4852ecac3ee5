"""The training-floor benchmark runs end to end (``--quick``: Criteo tables capped at 5,000 rows) and reports every system."""

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
