"""benchmarks/device_session.py: the prepared device check runs its steps on CPU (--check) and writes where it says."""

import argparse
import json

from benchmarks import device_session


def test_check_runs_the_bench_step_and_writes_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    done = device_session.main(["--check", "--out", str(tmp_path / "results")])
    assert [d["step"] for d in done] == ["bench-gpu"] and done[0]["exit"] == 0, done
    speed = json.loads(next((tmp_path / "results").glob("gpu_speed_*.json")).read_text())
    assert {r["mode"] for r in speed["runs"]} == {"eager", "graphs", "batch1"} and {r["precision"] for r in speed["runs"]} == {"bf16-mixed"}
    assert "| bench-gpu | 0 |" in next((tmp_path / "results").glob("device_session_*.md")).read_text()
    assert {p.name for p in (tmp_path / "out").iterdir()} == {p.name for p in (tmp_path / "results").iterdir()}


def test_on_a_device_the_gpu_tests_come_first_and_the_recipe_last(tmp_path):
    args = argparse.Namespace(check=False, recipe=True)
    names = [name for name, _, _ in device_session.plan(args, tmp_path, "2026-11-29")]
    assert names == ["gpu-tests", "bench-gpu", "recipe"]
    assert device_session.device_slug() == "cpu-check"
