"""The ``comera-lightning`` command line: LightningCLI with the CoMERA callback, data→model links and loggers.

    comera-lightning fit  --config configs/transformer_tiny.yaml
    comera-lightning test --config configs/transformer_tiny.yaml --ckpt_path last          # the newest last.ckpt of earlier runs
    comera-lightning fit  --config configs/transformer_tiny.yaml --ckpt_path last          # resume the newest run
    comera-lightning fit  --config configs/transformer_tiny.yaml --dense true     # dense baseline, no callback
    comera-lightning fit  --config configs/transformer_tiny.yaml --wandb online   # W&B online (offline by default)
    comera-lightning fit  --config configs/transformer_tiny.yaml --print_config   # the full, re-parsable config

``model:`` and ``data:`` take any LightningModule / LightningDataModule by ``class_path``. The
``comera:`` section holds the :class:`~comera_lightning.ComeraCallback` arguments; the callback is
on unless ``--dense true``. The data module's ``vocab_size``, ``num_classes``, ``pad_token_id``,
``table_sizes``, ``feature_names`` and ``num_dense`` (whichever it has) are passed to the model's
argument of the same name (whichever it takes), so configs leave those out.

Loggers: a ``CSVLogger`` (``logs/<config name>[_dense]/version_N``) and a ``WandbLogger`` are
added unless ``trainer.logger`` already has one of that kind (``trainer.logger: false`` turns all
logging off). The W&B mode is ``--wandb`` if given, else ``$WANDB_MODE``, else ``offline``;
``disabled`` adds no W&B logger. After ``fit`` the compression curves of the CSV log are drawn
to ``compression.png`` beside ``metrics.csv``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from .callback import ComeraCallback

__all__ = ["ComeraCLI", "finish_wandb", "latest_checkpoint", "main", "resolve_wandb_mode", "write_compression_plot"]

#: Data-module attributes passed on to the model argument of the same name, when both exist.
DATA_TO_MODEL_LINKS = ("vocab_size", "num_classes", "pad_token_id", "table_sizes", "feature_names", "num_dense")
WANDB_MODES = ("offline", "online", "disabled")
_WANDB_ALIASES = {"dryrun": "offline", "run": "online"}
WANDB_PROJECT = "comera-lightning"
LOGS_DIR = "logs"


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
    from .plot import plot_compression

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
        kwargs.setdefault("model_class", LightningModule)
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)  # the models build their own (param groups)
        super().__init__(args=args, run=run, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add the ``comera:`` section, ``--dense``, ``--wandb`` and the data→model links."""
        parser.add_lightning_class_args(ComeraCallback, "comera")
        parser.add_argument(
            "--dense", type=bool, default=False,
            help="Train the plain dense model: the comera: section is parsed but the callback is not used.",
        )
        parser.add_argument(
            "--wandb", type=Literal["offline", "online", "disabled"] | None, default=None,
            help="W&B mode (default: $WANDB_MODE, else offline); 'disabled' adds no W&B logger.",
        )
        for name in DATA_TO_MODEL_LINKS:  # a link is skipped when the data or the model lacks the name
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")

    def after_instantiate_classes(self) -> None:
        """Keep Lightning from refusing to log when a linked value differs from the data module's own argument."""
        model_hp = getattr(self.model, "hparams_initial", {})
        data_hp = getattr(self.datamodule, "hparams_initial", {})
        clashes = [k for k in DATA_TO_MODEL_LINKS if k in model_hp and k in data_hp and model_hp[k] != data_hp[k]]
        if clashes and getattr(self.datamodule, "_log_hyperparams", False):
            # e.g. data.vocab_size=8192 asked of the tokenizer, 7,312 tokens learnt and passed to the model.
            # Lightning merges both into one dict for the loggers and raises on such a clash; config.yaml keeps all.
            self.datamodule._log_hyperparams = False
            values = ", ".join(f"{k}: data {data_hp[k]!r}, model {model_hp[k]!r}" for k in clashes)
            rank_zero_info(f"Not sending the data module's hyper-parameters to the loggers ({values}); config.yaml has them.")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the Trainer with the CoMERA callback (unless ``--dense``) and the CSV/W&B loggers."""
        dense = bool(self._get(self.config, "dense"))
        keys = [k for k in self._parser(self.subcommand).callback_keys if not (dense and k == "comera")]
        callbacks = [self._get(self.config_init, k) for k in keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        config["logger"] = self._loggers(config.get("logger"), config.get("default_root_dir"), dense)
        return self._instantiate_trainer(config, callbacks)

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
            loggers.append(WandbLogger(name=f"{csv.name}/version_{csv.version}", save_dir=csv.save_dir, project=project, mode=mode))
        return loggers

    def before_fit(self) -> None:
        """``--ckpt_path last``: resume the newest ``last.ckpt`` of this config's earlier runs."""
        self._resolve_last_checkpoint("fit")

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
        """Draw the compression curves of the run that just finished."""
        write_compression_plot(self.trainer)


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


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``comera-lightning`` console script and of ``python -m comera_lightning``."""
    from .export_cli import run_export_cli  # `export` and `predict --program` (docs/INFERENCE.md)

    if run_export_cli(list(args) if args is not None else sys.argv[1:]):
        return
    cli = ComeraCLI(args=list(args) if args is not None else None)
    finish_wandb(getattr(cli, "trainer", None))
