"""Matching module names against ``target_modules`` / ``exclude_modules`` / ``layer_config`` rules.

* a **list** of strings: an entry matches a module whose full name equals it or ends with
  ``"." + entry`` (``"query"`` matches ``"encoder.layers.3.attention.query"``);
* a **string**: a regular expression that must match the whole module name;
* in ``layer_config`` keys, a key starting with ``"re:"`` is a regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from comera_lightning.tensorize.config import ModuleRules

__all__ = ["Rule", "overrides_for"]


def _entry_matches(name: str, entry: str) -> bool:
    return name == entry or name.endswith("." + entry)


class Rule:
    """A ``target_modules``/``exclude_modules`` rule that remembers which of its parts matched something."""

    def __init__(self, argument: str, rules: ModuleRules) -> None:
        self.argument = argument
        self.regex = re.compile(rules) if isinstance(rules, str) else None
        self.entries: list[str] = [] if rules is None or isinstance(rules, str) else list(rules)
        self.given = rules is not None
        self.used: set[str] = set()

    def matches(self, name: str) -> bool:
        """Whether ``name`` matches (and remember which part matched)."""
        if self.regex is not None:
            hit = self.regex.fullmatch(name) is not None
            if hit:
                self.used.add(self.regex.pattern)
            return hit
        hits = [e for e in self.entries if _entry_matches(name, e)]
        self.used.update(hits)
        return bool(hits)

    def unused(self) -> list[str]:
        """The parts that matched no module so far."""
        if self.regex is not None:
            return [] if self.used else [self.regex.pattern]
        return [e for e in self.entries if e not in self.used]


def overrides_for(name: str, layer_config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``layer_config`` overrides that apply to module ``name``, later keys winning."""
    merged: dict[str, Any] = {}
    for key, overrides in layer_config.items():
        hit = re.fullmatch(key[3:], name) if key.startswith("re:") else _entry_matches(name, key)
        if hit:
            merged.update(overrides)
    return merged
