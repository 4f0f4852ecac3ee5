"""Trained dense weights kept on disk, so that several compress runs (``compress.py``, ``compress_pairs.py``) share one
training."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["add_run_arguments", "apply_check", "load_or_train"]

CACHE = Path.home() / ".cache" / "comera_compress"


def add_run_arguments(parser: argparse.ArgumentParser, default_out: str, check: str) -> None:
    """``--cache`` (the trained weights), ``--out`` (the JSON), ``--check`` (``check``: what the smoke run is) and
    ``--served`` / ``--no-served`` (each model exported and timed: on unless turned off)."""
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the trained dense weights are kept")
    parser.add_argument("--out", type=Path, default=None, help=f"the JSON (default benchmarks/results/{default_out})")
    parser.add_argument("--check", action="store_true", help=check)
    parser.add_argument("--served", action=argparse.BooleanOptionalAction, default=True,
                        help="each trained system and the dense model exported (comera_lightning.export) and loaded "
                        "back: file bytes, batch-1/32 ms on CPU (served.py); --no-served skips it")


def apply_check(args: argparse.Namespace, settings: Mapping[str, Any], name: str) -> None:
    """With ``--check``: ``settings`` replace the arguments, and the JSON goes to a temporary file unless ``--out``."""
    if args.check:
        for key, value in settings.items():
            setattr(args, key, value)
        args.out = args.out or Path(tempfile.gettempdir()) / f"{name}_check.json"


def load_or_train(path: Path, train: Callable[[], tuple[dict[str, Any], torch.nn.Module]]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(weights, result, whether they came from ``path``): the file's when it exists, else ``train()``'s (its result and
    trained module), written to ``path``."""
    if path.exists():
        saved = torch.load(path, weights_only=False)
        return saved["state"], saved["result"], True
    result, module = train()
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state": state, "result": result}, path)
    return state, result, False
