"""The converter registry: which dense module types ``tensorize`` can turn into tensorized layers, and how.

A :class:`Converter` says how to build a :class:`~comera_lightning.layers.TensorizedModule` from a
dense module, which per-layer options (``layer_config`` keys) apply to it, and which options it
takes from the :class:`~comera_lightning.tensorize.config.TensorizeConfig`. ``register_converter``
adds one; an optional integration (TorchRec, Hugging Face) is declared with
``register_integration`` and imported only once the program has imported its dependency, so
looking a module up never imports a slow or missing package. docs/DESIGN_API.md has a worked example.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from comera_lightning._optional import loaded
from comera_lightning.layers import TensorizedModule

log = logging.getLogger(__name__)

__all__ = ["Converter", "converter_for", "known_options", "register_converter", "register_integration"]


@dataclass(frozen=True)
class Converter:
    """How one dense module type becomes a tensorized layer.

    ``build(module, options)`` returns the new layer; ``options`` holds ``defaults(config)``
    updated by the layer's ``layer_config`` overrides (only keys in ``options`` are allowed).
    ``unsupported(module)`` returns why a module of this type cannot be converted, or None.
    """

    kind: str
    build: Callable[[nn.Module, dict[str, Any]], TensorizedModule]
    options: frozenset[str]
    defaults: Callable[[Any], dict[str, Any]]  # TensorizeConfig -> options
    unsupported: Callable[[nn.Module], str | None] = lambda module: None


@dataclass(frozen=True)
class _Integration:
    dependency: str  # top-level package that must already be imported
    module: str  # our module that registers the converters
    options: frozenset[str]


_CONVERTERS: dict[type, Converter] = {}
_INTEGRATIONS: list[_Integration] = []
_FAILED: set[str] = set()


def register_converter(dense_type: type[nn.Module], converter: Converter) -> None:
    """Make ``tensorize`` convert modules of ``dense_type`` (and its subclasses) with ``converter``."""
    if not (isinstance(dense_type, type) and issubclass(dense_type, nn.Module)):
        raise TypeError(f"dense_type must be an nn.Module subclass, got {dense_type!r}.")
    _CONVERTERS[dense_type] = converter


def register_integration(dependency: str, module: str, options: Iterable[str]) -> None:
    """Declare that ``module`` registers converters for types of the optional package ``dependency``."""
    _INTEGRATIONS.append(_Integration(dependency, module, frozenset(options)))


def _load_integrations() -> None:
    """Import the integrations whose dependency the program has imported (each once; a broken one is skipped)."""
    for integration in _INTEGRATIONS:
        if integration.module in sys.modules or integration.module in _FAILED or loaded(integration.dependency) is None:
            continue
        try:
            importlib.import_module(integration.module)
        except ImportError as err:  # e.g. a partly installed torchrec: plain layers must still tensorize
            _FAILED.add(integration.module)
            log.warning("comera_lightning: %s not loaded (%s); its layer types are not tensorized.", integration.module, err)


def converter_for(module: nn.Module) -> Converter | None:
    """The converter for ``module``'s type (the most specific registered base class), or None."""
    _load_integrations()
    for cls in type(module).__mro__:
        if cls in _CONVERTERS:
            return _CONVERTERS[cls]
    return None


def known_options() -> frozenset[str]:
    """Every per-layer option any registered or declared converter accepts."""
    names = set().union(*(c.options for c in _CONVERTERS.values()), *(i.options for i in _INTEGRATIONS))
    return frozenset(names)
