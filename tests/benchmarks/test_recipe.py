"""benchmarks/quality/recipe: ``--check`` end to end on C4-style shards (one subprocess), the presets' shapes, the
CPU refusal, the scaled-down options."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.quality import recipe  # noqa: E402
from benchmarks.quality.models import attention_heads, dense_parameters  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def write_shards(root: Path) -> None:
    """Three C4-style gzip JSON-lines shards of 200 short documents."""
    root.mkdir()
    for shard in range(3):
        with gzip.open(root / f"c4-train.{shard:05d}-of-00003.json.gz", "wt", encoding="utf-8") as handle:
            for i in range(200):
                text = " ".join(WORDS[(i * 7 + j * (shard + 3)) % len(WORDS)] for j in range(20 + i % 40))
                handle.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": f"u{i}"}) + "\n")


def test_check_trains_dense_and_comera_the_anchors_way_on_text_files(tmp_path):
    write_shards(tmp_path / "c4")
    out = tmp_path / "recipe.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "COMERA_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.quality.recipe", "--check", "--precision", "bf16-mixed", "--device", "cpu",
                           "--data-files", str(tmp_path / "c4" / "c4-train.*.json.gz"), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    settings = results["settings"]
    assert (settings["warmup"], settings["min_lr"], settings["weight_decay"], settings["gradient_clip"]) == (0.1, 0.1, 0.01, 0.5)
    assert settings["one_pass"] and settings["accumulate"] == 2 and settings["precision"] == "bf16-mixed"
    assert results["preset"] == "check" and results["shape"] == {"width": 64, "ffn": 172, "blocks": 2, "heads": 1}
    data = results["data"]
    assert data["source"] == [str(tmp_path / "c4" / "c4-train.*.json.gz")] and data["validation"] == "the last training file"
    assert data["budget_tokens"] == 8 * 8 * 32 and data["train_tokens"] > 0 and data["val_tokens"] >= 2 * 4 * 32
    (entry,) = results["models"].values()
    assert list(entry["lrs"]) == ["0.001", "0.003"] and set(entry["systems"]) == {"dense", "comera"}
    for part in entry["lrs"].values():
        for result in part["systems"].values():
            assert [p["step"] for p in result["curve"]] == [4, 8] and result["curve"][-1]["tokens"] == 8 * 8 * 32
            assert 0 < result["curve"][0]["seconds"] < result["curve"][1]["seconds"]
    assert entry["systems"]["comera"]["parameters"] < entry["systems"]["dense"]["parameters"]
    assert "late stage from step 5" in proc.stderr and "prune (stage switch) at step 5" in proc.stderr  # 2/3 of 8 steps
    assert "| llama-64x2 | comera |" in proc.stdout and out.with_suffix(".png").stat().st_size > 0


@pytest.mark.parametrize("preset, width, heads, blocks, millions, steps",
                         [("60m", 512, 8, 8, 58, 10_000), ("130m", 768, 12, 12, 134, 20_000)])
def test_the_presets_are_the_anchors_shapes(preset, width, heads, blocks, millions, steps):
    spec, settings = recipe.recipe_of(recipe.parse_args(["--preset", preset, "--device", "cpu"]))
    assert (spec.width, attention_heads(spec.width), spec.layers) == (width, heads, blocks)
    assert round(dense_parameters(spec, settings.vocab_size, settings.block_size) / 1e6) == millions
    assert settings.steps == steps and settings.tokens_per_step == 512 * 256 and settings.vocab_size == 32_000
    assert settings.val_batches * settings.batch_size * settings.block_size >= 10_000_000
    assert settings.lrs == [1e-3, 3e-3] and settings.precision == "32-true"


def test_a_preset_on_a_cpu_is_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"^the 60m preset \(58M parameters, 10,000 steps of 131,072 tokens\) needs a "
                                         r"GPU: run it with --device cuda") as refused:
        recipe.main(["--preset", "60m", "--device", "cpu"])
    assert "\n" not in str(refused.value.code)
    args = recipe.parse_args(["--preset", "60m", "--device", "cpu", "--allow-cpu"])
    recipe.refuse_cpu(args, *recipe.recipe_of(args))  # allowed: no exit


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_cuda_without_a_device_is_refused():
    with pytest.raises(SystemExit, match=r"--device cuda: torch sees no CUDA device here"):
        recipe.recipe_of(recipe.parse_args(["--device", "cuda"]))


def test_the_budget_scales_down_by_options_and_bad_ones_are_named():
    _, settings = recipe.recipe_of(recipe.parse_args(["--preset", "130m", "--steps", "2000", "--batch-size", "256",
                                                      "--device", "cpu"]))
    assert (settings.steps, settings.batch_size, settings.accumulate, settings.epochs) == (2000, 128, 2, 10)
    with pytest.raises(SystemExit, match=r"--batch-size 100 must be a positive multiple of --micro-batch 64"):
        recipe.recipe_of(recipe.parse_args(["--batch-size", "100", "--micro-batch", "64", "--device", "cpu"]))
    with pytest.raises(SystemExit, match=r"--steps 5 is fewer than --evals 10"):
        recipe.recipe_of(recipe.parse_args(["--steps", "5", "--device", "cpu"]))
    with pytest.raises(SystemExit):
        recipe.parse_args(["--systems", "dense,narrow"])  # narrow needs comera


def test_a_text_file_the_reader_refuses_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path / "cache"))
    check = ["--check", "--device", "cpu", "--data-files"]
    (tmp_path / "only.jsonl").write_text('{"text": "one document"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^--data-files: one text file \(.*only\.jsonl\) cannot be both trained on "
                                         r"and held out"):
        recipe.main([*check, str(tmp_path / "only.jsonl")])
    (tmp_path / "more.jsonl").write_text('{"text": "fine"}\n{"txt": "no text field"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^--data-files: .*more\.jsonl: line 2: no string field 'text' \(keys: txt\)"):
        recipe.main([*check, str(tmp_path / "*.jsonl")])
    with pytest.raises(SystemExit, match=r"^--data-files: tokenizer file '.*missing\.json' does not exist"):
        recipe.main([*check, str(tmp_path / "*.jsonl"), "--tokenizer-file", str(tmp_path / "missing.json")])
