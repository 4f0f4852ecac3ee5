"""ComeraCLI: the LightningCLI of the ``comera-lightning`` command, with the CoMERA callback, data→model links and loggers.

    comera-lightning fit  --config transformer_tiny                       # a bundled config, by name
    comera-lightning fit  --config transformer_tiny --test_after_fit true # fit, then test, one W&B run
    comera-lightning test --config transformer_tiny --ckpt_path last      # the newest last.ckpt of earlier runs
    comera-lightning fit  --config transformer_tiny --ckpt_path last      # resume the newest run
    comera-lightning fit  --config transformer_tiny --dense true          # dense baseline, no callback
    comera-lightning fit  --config transformer_tiny --wandb online        # W&B online (offline by default)
    comera-lightning fit  --config transformer_tiny --threads 1           # torch CPU threads
    comera-lightning fit  --config my_run.yaml --print_config             # the full, re-parsable config

``--config`` takes a file or the name of a config shipped in the package (``config_files.py``).
``model:`` and ``data:`` take any LightningModule / LightningDataModule by ``class_path``. The
``comera:`` section holds the :class:`~comera_lightning.ComeraCallback` arguments (checked when the
command line is parsed); the callback is on unless ``--dense true``. The data module's
``vocab_size``, ``num_classes``, ``pad_token_id``, ``table_sizes``, ``feature_names`` and
``num_dense`` (whichever it has) are passed to the model's argument of the same name (whichever it
takes), so configs leave those out. Options are never abbreviated, and a misspelt one fails on one
line naming the closest valid keys (``parser.py``).

Loggers: a ``CSVLogger`` (``logs/<config name>[_dense]/version_N``) and a W&B logger are added
unless ``trainer.logger`` already has one of that kind (``trainer.logger: false`` turns all
logging off). The W&B mode is ``--wandb`` if given, else ``$WANDB_MODE``, else ``offline``;
``disabled`` adds no W&B logger. The W&B run gets the full resolved config, nested
(``wandb_run.py``). After ``fit`` the compression curves of the CSV log are drawn to
``compression.png`` beside ``metrics.csv``, with the rank heatmap ``ranks.png``; both go to W&B.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning
import torch
import yaml
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden

from comera_lightning._optional import require
from comera_lightning.callback import ComeraCallback
from comera_lightning.cli.config_files import config_help, resolve_config_args, show_configs_in_help
from comera_lightning.cli.parser import ComeraArgumentParser
from comera_lightning.cli.wandb_run import ComeraWandbLogger, upload_fit_images, write_summary
from comera_lightning.cli.weights_from import weights_when_built
from comera_lightning.tensorize import RuleMatchError, check_rules

__all__ = ["ComeraCLI", "finish_wandb", "latest_checkpoint", "resolve_wandb_mode", "write_compression_plot"]

#: Data-module attributes passed on to the model argument of the same name, when both exist.
DATA_TO_MODEL_LINKS = ("vocab_size", "num_classes", "pad_token_id", "table_sizes", "feature_names", "num_dense")
WANDB_MODES = ("offline", "online", "disabled")
_WANDB_ALIASES = {"dryrun": "offline", "run": "online"}
WANDB_PROJECT = "comera-lightning"
LOGS_DIR = "logs"
#: LightningCLI internals this module relies on (tested with lightning 2.4 to 2.6, pinned <2.7 in pyproject.toml).
_LIGHTNING_INTERNALS = ("_get", "_parser", "_instantiate_trainer")


#: The short strategy name of ``comera_lightning.distributed.TorchRecDMPStrategy`` (imported only when asked for).
TORCHREC_DMP = "torchrec_dmp"


def _check_lightning_internals() -> None:
    missing = [name for name in _LIGHTNING_INTERNALS if not hasattr(LightningCLI, name)]
    if missing:
        raise ImportError(
            f"comera_lightning's CLI needs LightningCLI.{', .'.join(missing)}, which lightning {lightning.__version__} "
            "no longer has; install a tested version: pip install 'lightning>=2.4,<2.7'."
        )


def resolve_wandb_mode(flag: str | None = None) -> str:
    """The W&B mode: ``flag`` if given, else ``$WANDB_MODE``, else ``"offline"``."""
    raw = flag or os.environ.get("WANDB_MODE") or "offline"
    mode = _WANDB_ALIASES.get(raw.lower(), raw.lower())
    if mode not in WANDB_MODES:
        source = "--wandb" if flag else "WANDB_MODE"
        raise ValueError(f"{source}={raw!r} is not a W&B mode; use one of {', '.join(WANDB_MODES)}.")
    return mode


def write_compression_plot(trainer: Trainer) -> Path | None:
    """Draw the run's compression curves next to its CSV ``metrics.csv``; the PNG path, or None if there is none."""
    from comera_lightning.cli.plot import plot_compression

    csv = next((lg for lg in trainer.loggers if isinstance(lg, CSVLogger)), None)
    if csv is None or not trainer.is_global_zero:
        return None
    metrics = Path(csv.log_dir) / "metrics.csv"
    if not metrics.is_file():
        return None
    try:
        out = plot_compression(metrics)
    except ValueError as err:  # a dense run logs no compression curves
        rank_zero_info(f"No compression plot: {err}")
        return None
    rank_zero_info(f"Compression curves: {out}")
    return out


class ComeraCLI(LightningCLI):
    """LightningCLI whose configs pick model and data by ``class_path``, with a ``comera:`` callback section."""

    def __init__(self, args: Any = None, run: bool = True, **kwargs: Any) -> None:
        _check_lightning_internals()
        if isinstance(args, (list, tuple)):
            args = resolve_config_args(args)
        kwargs.setdefault("parser_class", ComeraArgumentParser)
        kwargs.setdefault("model_class", LightningModule)
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)  # the models build their own (param groups)
        super().__init__(args=args, run=run, **kwargs)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser, with a ``--config`` help that names the bundled configs."""
        parser = super().init_parser(**kwargs)
        next(a for a in parser._actions if a.dest == "config").help = config_help()
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse as LightningCLI does; ``--help`` after ``--config`` shows that config's values as the defaults."""
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            subcommand = next((a for a in argv if a in getattr(self, "_subcommand_parsers", {})), None)
            show_configs_in_help(self._parser(subcommand), argv)
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the ``comera:`` section, ``--dense``, ``--wandb``, ``--threads``, ``--test_after_fit`` and the data→model links."""
        parser.add_lightning_class_args(ComeraCallback, "comera")
        parser.add_argument(
            "--dense", type=bool, default=False,
            help="Train the plain dense model: the comera: section is parsed but the callback is not used.",
        )
        parser.add_argument(
            "--wandb", type=Literal["offline", "online", "disabled"] | None, default=None,
            help="W&B mode (default: $WANDB_MODE, else offline); 'disabled' adds no W&B logger.",
        )
        parser.add_argument(
            "--threads", type=int | None, default=None,
            help="torch CPU threads (default: torch's own, one per core). On a small or busy CPU, 1 is often fastest.",
        )
        parser.add_argument(
            "--weights_from", type=str | None, default=None,
            help="fit: start from this dense checkpoint's weights (not a resume); with comera.tensorize.init svd, the "
                 "trained model is compressed (docs/COMPRESS.md).",
        )
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="fit: then test the final weights in the same process and W&B run.",
        )
        for name in DATA_TO_MODEL_LINKS:  # a link is skipped when the data or the model lacks the name
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        """Set ``--threads``; check the ``comera:`` values now (one line, no traceback) rather than after data setup."""
        threads = self._get(self.config, "threads")
        if threads is not None:
            if threads < 1:
                self.parser.error(f"--threads must be 1 or more, got {threads}.")
            torch.set_num_threads(threads)
        if self._get(self.config, "weights_from", default=None) is not None:
            if self.subcommand != "fit" or self._get(self.config, "ckpt_path", default=None) is not None:
                self.parser.error("--weights_from starts a fit from dense weights: use it with fit, without --ckpt_path "
                                  "(which resumes a run as it was).")
        comera = self._get(self.config, "comera")
        try:
            ComeraCallback(**comera.as_dict())
        except (TypeError, ValueError) as err:
            self.parser.error(f"comera: {err}")
        trainer = self._get(self.config, "trainer", default=None)
        if getattr(trainer, "strategy", None) == TORCHREC_DMP:
            require("comera_lightning.distributed", f"--trainer.strategy {TORCHREC_DMP}")  # registers the name

    def after_instantiate_classes(self) -> None:
        """Check the target rules against the model now; keep Lightning's hyper-parameter logging from refusing a link."""
        self._check_target_rules()
        model_hp = getattr(self.model, "hparams_initial", {})
        data_hp = getattr(self.datamodule, "hparams_initial", {})
        clashes = [k for k in DATA_TO_MODEL_LINKS if k in model_hp and k in data_hp and model_hp[k] != data_hp[k]]
        if clashes and getattr(self.datamodule, "_log_hyperparams", False):
            # e.g. data.vocab_size=8192 asked of the tokenizer, 7,312 tokens learnt and passed to the model.
            # Lightning merges both into one dict for the loggers and raises on such a clash; config.yaml keeps all.
            self.datamodule._log_hyperparams = False
            values = ", ".join(f"{k}: data {data_hp[k]!r}, model {model_hp[k]!r}" for k in clashes)
            rank_zero_info(f"Not sending the data module's hyper-parameters to the loggers ({values}); config.yaml has them.")

    def _check_target_rules(self) -> None:
        """A rule that names no module fails here, on one line, before data setup (a model built in configure_model: at setup)."""
        comera = self._get(self.config_init, "comera", default=None)
        if self._get(self.config, "dense") or not isinstance(comera, ComeraCallback):
            return
        if not is_overridden("configure_model", self.model, LightningModule):
            try:
                check_rules(self.model, comera.tensorize_config)
            except RuleMatchError as err:
                sys.stderr.write(f"error: comera: {err}\n")
                raise SystemExit(2) from None

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the Trainer with the CoMERA callback (unless ``--dense``) and the CSV/W&B loggers."""
        dense = bool(self._get(self.config, "dense"))
        keys = [k for k in self._parser(self.subcommand).callback_keys if not (dense and k == "comera")]
        callbacks = [self._get(self.config_init, k) for k in keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        config["logger"] = self._loggers(config.get("logger"), config.get("default_root_dir"), dense)
        return self._instantiate_trainer(config, callbacks)

    def resolved_config(self) -> dict[str, Any]:
        """The parsed config of this command as a nested dict, with the values linked from the data module filled in."""
        subcommand_config = self.config.get(str(self.subcommand), self.config)
        dump = self._parser(self.subcommand).dump
        keep_none = "skip_unset" if "skip_unset" in inspect.signature(dump).parameters else "skip_none"  # jsonargparse >= 4.49
        config = yaml.safe_load(dump(subcommand_config, **{keep_none: False}))
        model_args = (config.get("model") or {}).get("init_args")
        hparams = getattr(self.model, "hparams_initial", {})
        if isinstance(model_args, dict):
            model_args.update({k: hparams[k] for k in DATA_TO_MODEL_LINKS if k in hparams})
        config.pop("config", None)  # the config files' paths: the values they held are all here
        return config

    def _run_name(self, dense: bool) -> str:
        configs = self._get(self.config, "config") or []
        name = Path(str(configs[0])).stem if configs else type(self.model).__name__
        return f"{name}_dense" if dense else name

    def _loggers(self, logger: Any, root: str | None, dense: bool) -> list[Logger] | bool:
        if logger is False:
            return False
        loggers: list[Logger] = [] if logger in (None, True) else list(logger) if isinstance(logger, Sequence) else [logger]
        save_dir = str(Path(root or ".") / LOGS_DIR)
        name = self._run_name(dense)
        if not any(isinstance(lg, CSVLogger) for lg in loggers):
            loggers.insert(0, CSVLogger(save_dir=save_dir, name=name))
        mode = resolve_wandb_mode(self._get(self.config, "wandb"))
        if mode != "disabled" and not any(isinstance(lg, WandbLogger) for lg in loggers):
            csv = next(lg for lg in loggers if isinstance(lg, CSVLogger))
            project = os.environ.get("WANDB_PROJECT", WANDB_PROJECT)
            loggers.append(ComeraWandbLogger(
                name=f"{csv.name}/version_{csv.version}", save_dir=csv.save_dir, project=project, mode=mode,
                run_config=self.resolved_config(),
            ))
        return loggers

    def before_fit(self) -> None:
        """``--ckpt_path last``: resume the newest ``last.ckpt`` of this config's earlier runs; ``--weights_from``: the
        dense weights go in before the callback tensorizes the model."""
        self._resolve_last_checkpoint("fit")
        weights = self._get(self.config, "weights_from", default=None)
        if weights is not None:
            weights_when_built(self.model, weights)

    def before_validate(self) -> None:
        """``--ckpt_path last``: the newest ``last.ckpt`` of this config's runs."""
        self._resolve_last_checkpoint("validate")

    def before_test(self) -> None:
        """``--ckpt_path last``: the newest ``last.ckpt`` of this config's runs."""
        self._resolve_last_checkpoint("test")

    def _resolve_last_checkpoint(self, subcommand: str) -> None:
        # Each run writes to a new logs/<name>/version_N, where Lightning's own "last" lookup finds nothing
        # and silently starts over: look in the earlier versions instead, and say so when there is none.
        config = self.config_init[subcommand]
        csv = next((lg for lg in self.trainer.loggers if isinstance(lg, CSVLogger)), None)
        if config.get("ckpt_path") != "last" or csv is None:
            return
        found = latest_checkpoint(Path(csv.root_dir), exclude=Path(csv.log_dir))
        if found is None:
            raise ValueError(
                f"--ckpt_path last: no earlier run of this config left a last.ckpt under {csv.root_dir}/version_*/checkpoints/. "
                "Give the checkpoint's path, or train first with a ModelCheckpoint(save_last=true) (all bundled configs have one)."
            )
        rank_zero_info(f"--ckpt_path last: resuming from {found}")
        config["ckpt_path"] = str(found)

    def after_fit(self) -> None:
        """Draw and upload the compression curves and rank heatmap; test now if ``--test_after_fit``."""
        upload_fit_images(self.trainer, write_compression_plot(self.trainer))
        if self._get(self.config, "test_after_fit"):
            self.trainer.test(self.model, datamodule=self.datamodule)
            self.after_test()
        else:
            write_summary(self.trainer)

    def after_test(self) -> None:
        """Put the final compression and test metrics in the W&B run's summary."""
        write_summary(self.trainer, {k: v for k, v in self.trainer.callback_metrics.items() if k.startswith("test")})


def latest_checkpoint(root: Path, exclude: Path | None = None) -> Path | None:
    """The most recently written ``version_*/checkpoints/last.ckpt`` under ``root`` (not in ``exclude``), or None."""
    found = [p for p in root.glob("version_*/checkpoints/last.ckpt") if exclude is None or exclude.resolve() not in p.resolve().parents]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def finish_wandb(trainer: Trainer | None) -> None:
    """Close the W&B run of ``trainer``'s loggers, if one was started (flushes offline files)."""
    if trainer is None:
        return
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger) and lg._experiment is not None:
            lg._experiment.finish()
