"""One way to use optional dependencies (TorchRec, Hugging Face ``transformers``, Triton).

``require(module, feature)`` imports a module that a feature needs, or raises an
``ImportError`` naming the feature and the install command. ``loaded(module)`` imports it only if
the program already has (a model holding a TorchRec module has imported torchrec), so checks
like "is this an EmbeddingBagCollection?" never pay a slow import nor fail without the package.
``installed(module)`` imports it when it can and returns None when it cannot (a faster path that
needs Triton asks it once, and falls back to plain torch without it).
``lazy_exports(package, names)`` gives a package ``__init__`` a ``__getattr__`` that imports
the submodule holding an optional name on first use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["EXTRAS", "installed", "lazy_exports", "loaded", "require"]

#: The pip extra that installs each optional top-level package.
EXTRAS = {
    "torchrec": "recsys", "transformers": "hf", "triton": "gpu",
    **dict.fromkeys(("jsonargparse", "yaml", "tokenizers", "pyarrow", "matplotlib", "wandb"), "cli"),
}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (e.g. ``"torchrec.sparse.jagged_tensor"``) or raise an ImportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".", 1)[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'comera_lightning[{extra}]'" if extra else f"pip install {top}"
        raise ImportError(f"{feature} needs {top}: {how}. Importing {module} failed with: {err}") from err


def loaded(module: str) -> ModuleType | None:
    """``module`` if its top-level package is already imported and it imports cleanly, else None (never a slow import)."""
    if sys.modules.get(module.split(".", 1)[0]) is None:
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def installed(module: str) -> ModuleType | None:
    """``module`` imported, or None when it is not installed or fails to import (a fallback takes over)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing ``package.<names[name]>`` on first access of ``name``."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
