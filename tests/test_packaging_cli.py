"""Issue 18: configs found by name, one-line CLI errors, a core that imports alone, the W&B offline run read back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from comera_lightning.cli import main
from comera_lightning.cli.parser import closest_keys
from comera_lightning.cli.config_files import CONFIG_DIR, bundled_configs, resolve_config
from comera_lightning.cli.wandb_offline import read_offline_run

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1",
    "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
    "--data.init_args.limit_train_samples", "256", "--data.init_args.limit_eval_samples", "64",
    "--comera.early_epochs", "null", "--comera.late_epochs", "null", "--comera.prune_every_n_epochs", "null",
    "--comera.early_steps", "2", "--comera.late_steps", "2", "--threads", "1",
]


def test_configs_are_found_by_name_by_path_and_through_the_checkout_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"transformer_tiny", "dlrm_tiny", "codebert_tiny"} <= set(bundled_configs())
    bundled = str(CONFIG_DIR / "transformer_tiny.yaml")
    monkeypatch.chdir(tmp_path)  # outside the checkout
    assert resolve_config("transformer_tiny") == bundled == resolve_config("configs/transformer_tiny.yaml")
    assert (ROOT / "configs" / "transformer_tiny.yaml").resolve() == Path(bundled)
    own = tmp_path / "transformer_tiny.yaml"
    own.write_text("seed_everything: 1\n")
    assert resolve_config("transformer_tiny.yaml") == "transformer_tiny.yaml"  # a file given wins
    with pytest.raises(FileNotFoundError, match="bundled: codebert"):
        resolve_config("transformer_tny")


@pytest.mark.parametrize("args,named", [
    (["--trainer.max_epoch", "1"], "trainer.max_epochs"),  # an abbreviation is refused
    (["--comera.max_rnak", "3"], "comera.max_rank"),
    (["--comera.target_ratio", "2"], "target_ratio must be a number in (0.0, 1.0]"),
    (["--threads", "0"], "--threads must be 1 or more"),
])
def test_bad_options_fail_on_one_line(args: list[str], named: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "transformer_tiny", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err


def test_closest_keys_prefers_the_same_section() -> None:
    known = ["trainer.max_epochs", "trainer.min_epochs", "comera.max_rank", "model"]
    assert closest_keys("trainer.max_epoch", known)[0] == "trainer.max_epochs"
    assert closest_keys("comera.max_rnak", known) == ["comera.max_rank"]


def test_core_imports_without_the_cli_extra() -> None:
    # An import of an optional package made directly by a comera_lightning module fails (Lightning and
    # torchmetrics import some of them on their own when installed: those are allowed through).
    blocked = ("tokenizers", "pyarrow", "matplotlib", "wandb", "jsonargparse", "torchrec", "transformers")
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] not in {blocked!r}: return None\n"
        "        frame = sys._getframe(1)\n"
        "        while frame and frame.f_globals.get('__name__', '').startswith(('importlib', '_frozen_importlib')):\n"
        "            frame = frame.f_back\n"
        "        if frame and frame.f_globals.get('__name__', '').startswith('comera_lightning'):\n"
        "            raise ModuleNotFoundError(f\"{frame.f_globals['__name__']} imports {name}\")\n"
        "sys.meta_path.insert(0, Block())\n"
        "import comera_lightning, comera_lightning.data, comera_lightning.models, comera_lightning.strategy\n"
        "from comera_lightning import ComeraCallback, TTLinear, tensorize\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_wandb_offline_run_holds_the_nested_config_images_and_summary(tmp_path: Path) -> None:
    # Its own process, as a user runs it: W&B's service is per process, and an earlier run in this one may hold it
    # (and leave WANDB_SERVICE in the environment, which would send the child's run to that service: no .wandb file).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env = {**inherited, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "COMERA_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "comera_lightning", "fit", "--config", "transformer_tiny", *TINY,
               "--test_after_fit", "true", "--comera.rank_weight", "0.02"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = next(tmp_path.glob("logs/wandb/offline-run-*"))
    run = read_offline_run(run_dir)
    config = run["config"]
    assert config["comera"]["target_ratio"] == 0.3 and config["comera"]["rank_weight"] == 0.02
    assert config["comera"]["early_steps"] == 2 and config["comera"]["tensorize"]["max_rank"] == 16
    assert config["comera"]["early_epochs"] is None and "max_rank" in config["comera"], "unset values are recorded too"
    assert config["seed_everything"] == 0 and config["trainer"]["max_epochs"] == 1
    assert config["model"]["init_args"]["vocab_size"] > 0  # the value linked from the data module, filled in
    assert "vocab_size" not in config and "d_model" not in config, "no flat duplicates of the nested keys"
    assert run["summary"]["final/compression_tt"] > 1 and "final/test/acc" in run["summary"]
    keys = {k for row in run["history"] for k in row}
    assert "comera/compression_tt" in keys and "test/acc" in keys  # fit and test in the same run
    assert any(k.startswith("comera/rank/") for k in keys) and not any(k.count("/") > 2 and k.startswith("comera/rank/") and k.rsplit("/", 1)[1].isdigit() for k in keys)
    images = {p.name.rsplit("_", 2)[0] for p in run_dir.glob("files/media/images/comera/*.png")}
    assert images == {"compression_plot", "rank_heatmap"}


def test_demo_summary_names_the_layers_pruned_to_rank_0() -> None:
    from comera_lightning.cli.demo import format_summary

    summary = {"test_acc": 0.84, "tt_params": 11_962, "dense_tt_params": 590_464, "params": 54_461, "dense_params": 632_963,
               "model_compression": 11.6, "tt_compression": 49.4, "wall_s": 60.0, "csv_dir": "logs/x", "wandb_dir": None,
               "png": None, "tt_layers": 5, "rank0_layers": ["encoder.0.ffn.intermediate", "encoder.0.ffn.output"]}
    text = format_summary(summary)
    assert "pruned to rank 0         2 of 5 TT layers output their bias only: encoder.0.ffn.intermediate, encoder.0.ffn.output" in text
    assert "pruned to rank 0" not in format_summary({**summary, "rank0_layers": []})
