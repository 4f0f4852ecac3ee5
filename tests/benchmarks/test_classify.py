"""benchmarks/quality/classify.py: the classifier race end to end on a tiny Llama, and its chance loss."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from benchmarks.quality import classify  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_quick_classifier_race_reports_dense_and_comera(tmp_path):
    out = tmp_path / "classify.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.quality.classify", "--quick", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    runs = results["models"]["llama:64:1"]["0.001"]
    assert set(runs) == {"dense", "comera"}
    assert results["command"] == "python -m benchmarks.quality.classify --quick", "no local path in the JSON"
    assert runs["comera"]["tt_parameters"] > 0 and runs["dense"]["tt_parameters"] == 0
    for run in runs.values():
        assert len(run["curve"]) == 2 and run["steps"] == 20
        assert all(0 < p["val_loss"] < 5 and 0 <= p["val_acc"] <= 1 for p in run["curve"])
    assert 0 < results["chance_loss"] < math.log(3)
    assert "| llama:64:1 | 0.001 | comera |" in proc.stdout


def test_chance_is_the_entropy_of_the_training_classes():
    class Counts:
        def class_counts(self, split):
            return {"negative": 1, "neutral": 1, "positive": 2, "other": 0}

    assert classify.chance_loss(Counts()) == pytest.approx(-(0.5 * math.log(0.25) + 0.5 * math.log(0.5)))
    with pytest.raises(ValueError, match="unknown classifier family"):
        classify.build_classifier("t5", 32, 1, 100, 3, 0, 16)
