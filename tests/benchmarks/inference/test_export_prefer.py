"""benchmarks/inference/export_prefer.py --quick: each workload exported every way, sized, checked and timed."""

import pytest

pytest.importorskip("transformers")

from benchmarks.inference import export_prefer  # noqa: E402


def run_quick(tmp_path, workload: str) -> dict:
    import torch

    threads = torch.get_num_threads()
    try:
        report = export_prefer.main(["--quick", "--workloads", workload, "--out", str(tmp_path / "prefer.json")])
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "prefer.json").exists()
    result = report["workloads"][workload]
    assert all(error < 1e-3 for error in result["max_abs_error"].values()), result["max_abs_error"]
    for timing in result["timing"].values():
        assert set(timing["ms_median"]) == set(result["sizes"]) and timing["speed_over_size"] > 0
    return result


def test_the_llama_is_exported_both_ways_sized_checked_and_timed(tmp_path):
    sizes = run_quick(tmp_path, "llama")["sizes"]
    assert list(sizes) == ["dense", "size", "speed"]
    # "size" keeps the trained parameters; "speed" serves the 3,000-row token table whole
    assert sizes["size"]["program_bytes"] <= 1.2 * sizes["size"]["parameter_bytes"] < sizes["speed"]["program_bytes"]
    assert sizes["speed"]["forms"]["dense"] == 1 and "dense" not in sizes["size"]["forms"]


@pytest.mark.slow
def test_the_dlrm_is_exported_every_way_sized_checked_and_timed(tmp_path):
    pytest.importorskip("torchrec")
    sizes = run_quick(tmp_path, "dlrm")["sizes"]
    assert list(sizes) == ["dense", "size", "size_hot", "speed"]
    # --quick caps the tables at 5,000 rows: "speed" serves every one whole, as dense does; "size" keeps the cores
    assert sizes["size"]["program_bytes"] < sizes["speed"]["program_bytes"] == sizes["dense"]["program_bytes"]
