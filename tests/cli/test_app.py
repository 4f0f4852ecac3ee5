"""The ``comera-lightning`` command line: every tiny config fits a few steps, configs round-trip, typos fail."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from comera_lightning import ComeraCallback, TensorizeConfig
from comera_lightning.cli import main
from comera_lightning.cli.app import ComeraCLI, resolve_wandb_mode
from comera_lightning.cli.wandb_run import ComeraWandbLogger
from tests.helpers.cli_runs import ALL_CONFIGS, FEW_STEPS, ROOT, TINY_CONFIGS, small


@pytest.mark.parametrize("config", TINY_CONFIGS, ids=[c.stem for c in TINY_CONFIGS])
def test_tiny_config_fits_a_few_steps(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # configs may name their own (relative) log folders
    cli = ComeraCLI(args=["fit", *small(config), *FEW_STEPS, "--trainer.default_root_dir", str(tmp_path)])
    assert cli.trainer.global_step == 4
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, ComeraCallback))
    assert callback.stage == "final" and callback.prune_events >= 2
    run_dir = Path(cli.trainer.loggers[0].log_dir).resolve()
    assert run_dir.is_relative_to(tmp_path.resolve())
    assert (run_dir / "metrics.csv").is_file() and (run_dir / "config.yaml").is_file()
    assert (run_dir / "compression.png").is_file()


def test_dense_flag_drops_the_callback_and_names_the_run(tmp_path: Path) -> None:
    config = ROOT / "configs" / "transformer_tiny.yaml"
    cli = ComeraCLI(args=[*small(config), "--dense", "true", "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert not any(isinstance(c, ComeraCallback) for c in cli.trainer.callbacks)
    assert cli.trainer.loggers[0].log_dir == str(tmp_path / "logs" / "transformer_tiny_dense" / "version_0")
    assert cli.model.hparams.vocab_size == cli.datamodule.vocab_size  # linked from the data module
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes


def test_wandb_logger_follows_flag_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.loggers import CSVLogger

    config = ROOT / "configs" / "transformer_tiny.yaml"
    cli = ComeraCLI(args=[*small(config), "--wandb", "offline", "--trainer.default_root_dir", str(tmp_path)], run=False)
    kinds = [type(lg) for lg in cli.trainer.loggers]
    assert kinds == [CSVLogger, ComeraWandbLogger]
    assert cli.trainer.loggers[1]._wandb_init["mode"] == "offline"  # no run is started here
    monkeypatch.delenv("WANDB_MODE")
    assert resolve_wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert resolve_wandb_mode() == "online" and resolve_wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_wandb_mode() == "offline"
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes'"):
        monkeypatch.setenv("WANDB_MODE", "sometimes")
        resolve_wandb_mode()


def _print_config(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=[c.stem for c in ALL_CONFIGS])
def test_print_config_round_trips(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _print_config(["--config", str(config)], capsys)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(first)
    assert _print_config(["--config", str(dumped)], capsys) == first
    parsed = yaml.safe_load(first)
    assert "comera" in parsed and parsed["dense"] is False
    assert "vocab_size" not in parsed["model"]["init_args"]  # a link target, filled in from the data module


@pytest.mark.parametrize("section,key", [("comera", "max_rnak"), ("comera.tensorize", "embedding_max_rnak"), ("model.init_args", "d_modle"), ("trainer", "max_epoch")])
def test_config_typo_fails_naming_the_key(
    section: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load((ROOT / "configs" / "transformer_tiny.yaml").read_text())
    node = config
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[key] = 3
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(bad), "--print_config"])
    assert exit_info.value.code not in (0, None)
    assert key in capsys.readouterr().err


def test_module_help_prints_only_usage() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    quiet = subprocess.run([sys.executable, "-c", "import comera_lightning.cli.app, comera_lightning.cli.demo"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    result = subprocess.run([sys.executable, "-m", "comera_lightning", "--help"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:") and "{fit,validate,test,predict}" in result.stdout
    assert result.stderr == ""


def test_ckpt_path_last_resumes_the_newest_earlier_run_or_says_there_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs" / "transformer_tiny.yaml"
    args = [*small(config), *FEW_STEPS, "--trainer.default_root_dir", str(tmp_path)]
    with pytest.raises(ValueError, match=r"--ckpt_path last: no earlier run of this config left a last.ckpt"):
        ComeraCLI(args=["fit", *args, "--ckpt_path", "last"])
    first = ComeraCLI(args=["fit", *args])
    assert first.trainer.global_step == 4
    resumed = ComeraCLI(args=["fit", *args, "--trainer.max_epochs", "3", "--trainer.max_steps", "100", "--ckpt_path", "last"])
    assert 4 < resumed.trainer.global_step < 12, "continued from step 4 (from scratch, 3 epochs of 4 steps give 12)"
    used = Path(resumed.trainer.ckpt_path)
    assert used.name == "last.ckpt" and used.parent.parent == Path(first.trainer.loggers[0].log_dir)


def test_a_run_resumed_from_the_cli_ends_where_the_uninterrupted_run_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformer_tiny (dropout, shuffled length buckets): resumed from step 6 of 12, mid-epoch, same weights."""
    monkeypatch.chdir(tmp_path)
    config = ROOT / "configs" / "transformer_tiny.yaml"
    args = [*small(config), "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "3", "--trainer.max_steps", "12",
            "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
            "--comera.early_epochs", "null", "--comera.late_epochs", "null", "--comera.prune_every_n_epochs", "null",
            "--comera.early_steps", "4", "--comera.prune_every_n_steps", "3", "--comera.gate_lr", "0.3"]
    every3 = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=3",
              "--trainer.callbacks.save_top_k=-1", f"--trainer.callbacks.dirpath={tmp_path / 'every3'}"]
    straight = ComeraCLI(args=["fit", *args, *every3])
    resumed = ComeraCLI(args=["fit", *args, "--ckpt_path", str(next((tmp_path / "every3").glob("*step=6.ckpt")))])
    assert resumed.trainer.global_step == straight.trainer.global_step == 12
    comera = [next(c for c in cli.trainer.callbacks if isinstance(c, ComeraCallback)) for cli in (straight, resumed)]
    assert comera[0].prune_events >= 2 and comera[0].schedule.state_dict() == comera[1].schedule.state_dict()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)


def _help_options(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``comera-lightning <args> --help``: each ``--comera*`` option's help text, wrapped lines joined."""
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--help"])
    assert exit_info.value.code == 0
    options: dict[str, str] = {}
    current = None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  --comera"):
            current, _, rest = line.strip().partition("  ")
            options[current.split(",")[0].split()[0]] = rest
        elif current is not None and line.startswith(" " * 24):
            options[current.split(",")[0].split()[0]] += " " + line.strip()
        else:
            current = None
    return options


def test_every_comera_and_tensorize_option_has_a_description_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    options = _help_options(["fit"], capsys)
    expected = [f"--comera.{p}" for p in inspect.signature(ComeraCallback).parameters]
    expected += [f"--comera.tensorize.{name}" for name in TensorizeConfig.option_names()]
    assert not [name for name in expected if name not in options], "options missing from fit --help"
    undescribed = [name for name, text in options.items() if not re.sub(r"\(type: .*", "", text).strip()]
    assert not undescribed, undescribed


def _help_defaults(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """The ``default: ...`` each ``--comera*`` option shows in ``<args> --help``."""
    return {k: m.group(1) for k, text in _help_options(args, capsys).items() if (m := re.search(r"default: ([^)]*)\)", text))}


def test_help_after_configs_shows_their_values_as_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("comera:\n  target_ratio: 0.37\n  tensorize:\n    max_rank: 7\n")
    second.write_text("comera:\n  target_ratio: 0.41\n")
    plain = _help_defaults(["fit"], capsys)
    given = _help_defaults(["fit", "--config", str(first), "--config", str(second)], capsys)
    assert plain["--comera.target_ratio"] == str(inspect.signature(ComeraCallback).parameters["target_ratio"].default).replace("None", "null")
    assert plain["--comera.tensorize.max_rank"] == str(TensorizeConfig().max_rank).replace("None", "null")
    assert given["--comera.target_ratio"] == "0.41", "the later config wins"
    assert given["--comera.tensorize.max_rank"] == "7"
    assert given["--comera.tensorize.num_cores"] == plain["--comera.tensorize.num_cores"] == str(TensorizeConfig().num_cores)
    bundled = yaml.safe_load((ROOT / "configs" / "transformer_tiny.yaml").read_text())["comera"]["budget"]
    assert _help_defaults(["fit", "--config", "transformer_tiny"], capsys)["--comera.budget.target_ratio"] == str(bundled["target_ratio"])


@pytest.mark.parametrize("rule, when", [("nonexistent", "before data setup"), ("ffn_norm", "at setup")])  # ffn_norm: a LayerNorm
def test_a_target_rule_matching_nothing_fails_on_one_line_before_training(
    rule: str, when: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from comera_lightning.data.pairs import SentencePairDataModule

    monkeypatch.chdir(tmp_path)
    if when == "before data setup":
        monkeypatch.setattr(SentencePairDataModule, "setup", lambda *args, **kwargs: pytest.fail("the data was set up"))
    monkeypatch.setattr(ComeraCallback, "objective", lambda *args, **kwargs: pytest.fail("a training step ran"))
    config = ROOT / "configs" / "transformer_tiny.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *small(config), *FEW_STEPS, "--comera.target_modules", f"[{rule}]"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: comera: target_modules entries ['{rule}'] match no module of SentencePairClassifier that can be tensorized")
    listed = line.split("closest first: ")[1].split(". ")[0]
    assert "attention.query" in listed and "norm" not in listed and "dropout" not in listed
    if rule == "ffn_norm":
        assert listed.startswith("backbone.encoder.layers.{0,1}.ffn.")
