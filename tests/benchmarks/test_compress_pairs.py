"""benchmarks/quality/compress_pairs: one compression end to end on a few batches of the clothing-review pairs."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from benchmarks.quality import compress_pairs
from benchmarks.quality.code_models import CODE_MODELS
from benchmarks.quality.pair_models import PAIR_MODELS


def test_every_system_runs_from_the_trained_dense_weights(tmp_path):
    out = tmp_path / "compress.json"
    result = compress_pairs.main(["--check", "--no-served", "--cache", str(tmp_path / "cache"), "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["dense_steps"] == 8 and result["extra_steps"] == 2
    assert result["dense_ft"]["steps"] == 2
    runs = result["by_compression"]["8"]
    assert set(runs) == {"comera", "svd", "svd_ft", "prune_ft", "fixed", "small"}
    assert runs["svd"]["steps"] == 0 and runs["svd_ft"]["steps"] == 2 and runs["small"]["steps"] == 10
    assert runs["svd"]["parameters"] == runs["svd_ft"]["parameters"], "svd_ft fine-tunes svd's factors"
    assert abs(runs["prune_ft"]["parameters"] / runs["svd"]["parameters"] - 1) < 0.05, "pruned to the same weights"
    assert runs["comera"]["ranks"] and all(rank >= 1 for rank in runs["comera"]["ranks"].values())
    assert all(run["parameters"] < result["dense"]["parameters"] for run in runs.values())
    assert runs["small"]["d_model"] < PAIR_MODELS["transformer"].width
    assert "--out" not in result["command"] and "--cache" not in result["command"], "no local path in the JSON"
    assert "| 8× |" in compress_pairs.table(result)


def test_the_dense_training_is_cached_and_systems_choose_what_runs(tmp_path):
    cache = tmp_path / "cache"
    first = compress_pairs.main(["--check", "--no-served", "--systems", "comera", "--cache", str(cache), "--out", str(tmp_path / "a.json")])
    again = compress_pairs.main(["--check", "--no-served", "--systems", "comera,svd", "--comera", "late_objective=budget",
                                 "--cache", str(cache), "--out", str(tmp_path / "b.json")])
    assert len(list(cache.glob("*.pt"))) == 1 and again["dense"]["cached"]
    assert {k: v for k, v in again["dense"].items() if k != "cached"} == first["dense"]
    assert set(again["by_compression"]["8"]) == {"comera", "svd"} and "dense_ft" not in again
    assert "| compression | comera | svd |" in compress_pairs.table(again).splitlines()


@pytest.mark.slow
def test_served_programs_and_the_fine_tuning_lr(tmp_path):
    args = ["--check", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "a.json")]
    compress_pairs.main(args + ["--systems", "comera", "--no-served"])
    result = compress_pairs.main(args + ["--systems", "comera,svd_ft", "--ft-lr", "3e-4"])  # served by default
    runs = result["by_compression"]["8"]
    assert result["dense"]["cached"] and result["args"]["ft_lr"] == 3e-4
    assert all(run["served"]["file_bytes"] * 3 < result["dense"]["served"]["file_bytes"] for run in runs.values())
    assert all(run["served"]["ms_batch1"] > 0 and run["served"]["ms_batch32"] > 0 for run in runs.values())


def test_set_lr_sets_every_group_of_the_optimizer_built_after_it():
    model = PAIR_MODELS["transformer"].build(SimpleNamespace(vocab_size=100, num_classes=3), 16)
    PAIR_MODELS["transformer"].set_lr(model, 3e-4)
    assert {group["lr"] for group in model.configure_optimizers().param_groups} == {3e-4}


@pytest.mark.slow
def test_the_hugging_face_bert_is_compressed_the_same_way_with_its_own_cache(tmp_path):
    cache = tmp_path / "cache"
    compress_pairs.main(["--check", "--no-served", "--systems", "comera", "--cache", str(cache), "--out", str(tmp_path / "a.json")])
    result = compress_pairs.main(["--check", "--no-served", "--model", "bert", "--systems", "comera,svd_ft,small", "--cache", str(cache),
                                  "--out", str(tmp_path / "b.json")])
    assert result["model_kind"] == "bert" and len(list(cache.glob("*.pt"))) == 2, "one trained model per kind"
    runs = result["by_compression"]["8"]
    assert abs(runs["svd_ft"]["parameters"] / runs["comera"]["parameters"] - 1) < 0.05
    assert runs["small"]["d_model"] < PAIR_MODELS["bert"].width
    assert "Sentence-pair bert" in compress_pairs.table(result)


@pytest.mark.slow
def test_the_codebert_masked_lm_is_compressed_on_python_source(tmp_path):
    result = compress_pairs.main(["--check", "--model", "codebert", "--systems", "comera,svd_ft", "--cache",
                                  str(tmp_path / "cache"), "--out", str(tmp_path / "c.json")])
    runs = result["by_compression"]["8"]
    assert result["data"]["max_files"] == 200 and abs(runs["svd_ft"]["parameters"] / runs["comera"]["parameters"] - 1) < 0.05
    assert 0 <= runs["comera"]["test_acc"] <= 1 and "Masked LM codebert" in compress_pairs.table(result)
    assert runs["comera"]["served"]["file_bytes"] < result["dense"]["served"]["file_bytes"], "served as trained, smaller"


@pytest.mark.parametrize("options, problem", [(["--systems", "svd"], "add comera"),
                                              (["--systems", "comera,wide"], "unknown ['wide']"),
                                              (["--comera", "width=3"], "unknown ['width']")])
def test_a_wrong_option_is_refused_naming_it(options, problem, capsys):
    with pytest.raises(SystemExit):
        compress_pairs.main(options)
    assert problem in capsys.readouterr().err


def test_the_codebert_small_kind_is_the_bundled_configs_model_and_data():
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "codebert_small.yaml").read_text())
    model, data = config["model"]["init_args"], config["data"]["init_args"]
    kind = CODE_MODELS["codebert_small"]
    shape = ("d_model", "num_layers", "num_heads", "d_ff", "max_positions", "tie_word_embeddings", "lr_other", "warmup_steps")
    assert {name: kind.settings[name] for name in shape} == {name: model[name] for name in shape}
    assert kind.settings["lr_cores"] == model["lr_other"], "one LR for every group: the plain factors' and the cores' alike"
    assert kind.data_settings == {name: data[name] for name in kind.data_settings}
    assert (kind.width, kind.heads) == (384, 6)
