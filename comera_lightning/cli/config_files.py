"""The configs shipped inside the package (``comera_lightning/cli/configs/*.yaml``), found by name or by path.

``--config transformer_tiny`` (or ``transformer_tiny.yaml``) names a bundled config; any argument
that is an existing file is used as given, so ``--config configs/transformer_tiny.yaml`` in a
checkout and ``--config my_run.yaml`` keep working. With ``--help``, the values of the configs given
are shown as the defaults (:func:`show_configs_in_help`).
"""

from __future__ import annotations

import argparse
import difflib
import glob
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_DIR", "bundled_configs", "config_help", "given_configs", "resolve_config", "resolve_config_args", "show_configs_in_help"]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
_CONFIG_FLAGS = ("-c", "--config")
_HELP_FLAGS = ("-h", "--help")


def bundled_configs() -> list[str]:
    """Names of the configs shipped with the package (``transformer_tiny``, ...)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def config_help() -> str:
    """The ``--config`` option's help: files or bundled names, and which names there are."""
    return (
        f"A YAML config file, or the name of a bundled one: {', '.join(bundled_configs())}. "
        "Given again, later ones override earlier ones; options after it override both. "
        "With --help, the defaults shown are the config's values."
    )


def resolve_config(value: str) -> str:
    """``value`` if it is an existing file, else the bundled config it names; FileNotFoundError when neither."""
    if Path(value).expanduser().is_file():
        return value
    name = Path(value).name
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    bundled = CONFIG_DIR / f"{stem}.yaml"
    # "configs/x.yaml" run outside the checkout also means the bundled x: that is where configs/ points.
    if bundled.is_file() and Path(value).parent.name in ("", "configs"):
        return str(bundled)
    near = difflib.get_close_matches(stem, bundled_configs(), n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else "."
    raise FileNotFoundError(
        f"--config {value}: no such file, and no bundled config of that name{hint} (bundled: {', '.join(bundled_configs())})"
    )


def resolve_config_args(args: Sequence[str]) -> list[str]:
    """``args`` with each ``--config`` value that names a bundled config replaced by its path."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in _CONFIG_FLAGS and i + 1 < len(out):
            out[i + 1] = resolve_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve_config(arg.split("=", 1)[1])
    return out


def given_configs(args: Sequence[str]) -> list[str]:
    """The ``--config`` values in ``args``, in order."""
    found = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in _CONFIG_FLAGS]
    return found + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def show_configs_in_help(parser: Any, args: Sequence[str]) -> None:
    """With ``--help`` in ``args``: ``parser``'s help shows the given configs' values as the defaults.

    The run ends with the help, so the parser's defaults can be overwritten; jsonargparse reads the
    files (as it does its ``default_config_files``). A config that fails to load is left to the parse
    to report, and the help shows the class defaults.
    """
    configs = given_configs(args)
    if not configs or not any(arg in _HELP_FLAGS for arg in args):
        return
    parser.default_config_files = [glob.escape(str(Path(c).expanduser())) for c in configs]
    try:
        defaults = parser.get_defaults()
    except argparse.ArgumentError:
        return
    finally:
        parser.default_config_files = []
    for action in parser._actions:
        if action.default != argparse.SUPPRESS and action.dest in defaults:
            action.default = _plain(defaults[action.dest])
    parser.description = f"{parser.description or ''}\n\nThe defaults shown are the values of --config {' '.join(configs)}."


def _plain(value: Any) -> Any:
    """``value`` with jsonargparse's namespaces turned into dicts, as the help prints them."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.as_dict() if hasattr(value, "as_dict") else value
