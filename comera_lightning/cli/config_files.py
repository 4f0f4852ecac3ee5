"""The configs shipped inside the package (``comera_lightning/cli/configs/*.yaml``), found by name or by path.

``--config transformer_tiny`` (or ``transformer_tiny.yaml``) names a bundled config; any argument
that is an existing file is used as given, so ``--config configs/transformer_tiny.yaml`` in a
checkout and ``--config my_run.yaml`` keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["CONFIG_DIR", "bundled_configs", "resolve_config", "resolve_config_args"]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
_CONFIG_FLAGS = ("-c", "--config")


def bundled_configs() -> list[str]:
    """Names of the configs shipped with the package (``transformer_tiny``, ...)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


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
    raise FileNotFoundError(
        f"--config {value}: no such file, and no bundled config of that name (bundled: {', '.join(bundled_configs())})."
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
