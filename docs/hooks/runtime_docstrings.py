"""Griffe extension (mkdocs.yml, the python handler's ``extensions``): docstrings completed at import time.

``comera_lightning/callback/__init__.py`` appends the ``Args:`` entries of the ``BudgetConfig`` shortcuts
(``gate_lr``, ``early_steps`` ... ``size_surrogate``) to ``ComeraCallback.__doc__`` when it is imported; the
API pages read the source statically and would miss them, so these objects take the docstring Python sees.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

#: The objects whose docstring the package completes at import time.
RUNTIME_DOCSTRINGS = ("comera_lightning.callback.ComeraCallback",)


class RuntimeDocstrings(griffe.Extension):
    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if cls.path in RUNTIME_DOCSTRINGS and cls.docstring is not None:
            module, _, name = cls.path.rpartition(".")
            cls.docstring.value = inspect.cleandoc(getattr(importlib.import_module(module), name).__doc__)
