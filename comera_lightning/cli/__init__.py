"""The ``comera-lightning`` command (also ``python -m comera_lightning``): a table of subcommands.

    comera-lightning fit|validate|test|predict --config transformer_tiny ...   # LightningCLI (app.py)
    comera-lightning export  --config ... --ckpt_path last.ckpt --out model.pt2  # export.py
    comera-lightning predict --config ... --program model.pt2                    # export.py

``--config`` takes a file or the name of a bundled config (``config_files.py``). Our own
subcommands are the entries of :data:`SUBCOMMANDS`; every other command goes to
:class:`~comera_lightning.cli.app.ComeraCLI`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from comera_lightning.cli.config_files import resolve_config_args
from comera_lightning.cli.export import export_main, predict_main

__all__ = ["SUBCOMMANDS", "Subcommand", "main"]


@dataclass(frozen=True)
class Subcommand:
    """A subcommand of our own: ``run(args)`` when ``applies(args)`` (else LightningCLI's command of that name runs)."""

    run: Callable[[list[str]], object]
    help: str
    applies: Callable[[list[str]], bool] = lambda args: True


def _has_program(args: list[str]) -> bool:
    return any(a == "--program" or a.startswith("--program=") for a in args)


SUBCOMMANDS: dict[str, Subcommand] = {
    "export": Subcommand(export_main, "write a trained checkpoint as a torch.export program (docs/INFERENCE_EXPORT.md)"),
    "predict": Subcommand(predict_main, "with --program: run an exported program over the test split", _has_program),
}


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``comera-lightning`` console script and of ``python -m comera_lightning``."""
    try:
        argv = resolve_config_args(sys.argv[1:] if args is None else args)
    except FileNotFoundError as err:
        sys.stderr.write(f"error: {err}\n")
        raise SystemExit(2) from None
    command = SUBCOMMANDS.get(argv[0]) if argv else None
    if command is not None and command.applies(argv[1:]):
        command.run(argv[1:])
        return
    from comera_lightning.cli.app import ComeraCLI, finish_wandb
    from comera_lightning.tensorize import RuleMatchError

    if args is None:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (and warns when given both)
    try:
        cli = ComeraCLI(args=None if args is None else argv)
    except RuleMatchError as err:  # raised at the callback's setup, before training: a configuration error, one line
        sys.stderr.write(f"error: comera: {err}\n")
        raise SystemExit(2) from None
    finish_wandb(getattr(cli, "trainer", None))
