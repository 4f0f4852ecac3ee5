"""Matching module names against ``target_modules`` / ``exclude_modules`` / ``layer_config`` rules.

* a **list** of strings: an entry matches a module whose full name equals it or ends with
  ``"." + entry`` (``"query"`` matches ``"encoder.layers.3.attention.query"``);
* a **string**: a regular expression that must match the whole module name;
* in ``layer_config`` keys, a key starting with ``"re:"`` is a regular expression.

A rule part that matches no module is an error (:class:`RuleMatchError`) that lists the modules the
rule could have named, closest first (:func:`unmatched_error`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from comera_lightning.tensorize.config import ModuleRules

__all__ = ["Rule", "RuleMatchError", "closest_names", "group_indices", "overrides_for", "unmatched_error"]

#: How many candidate names an error lists.
SHOWN_CANDIDATES = 6


class RuleMatchError(ValueError):
    """A ``target_modules`` / ``exclude_modules`` entry that matches no module of the model."""


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


def _similarity(entry: str, name: str) -> float:
    """How close ``entry`` is to ``name`` or to one of its dotted suffixes (what a list entry matches)."""
    parts = name.split(".")
    return max(difflib.SequenceMatcher(None, entry, ".".join(parts[i:])).ratio() for i in range(len(parts)))


def closest_names(entries: Iterable[str], names: Iterable[str]) -> list[str]:
    """``names`` ordered by how close each is to the nearest of ``entries`` (closest first; ties keep their order)."""
    entries = list(entries)
    return sorted(names, key=lambda name: -max((_similarity(e, name) for e in entries), default=0.0))


def unmatched_error(rule: Rule, model_name: str, candidates: list[str]) -> RuleMatchError:
    """The error for ``rule``'s parts that matched nothing, listing the ``candidates`` (names that can be tensorized)."""
    unused = rule.unused()
    if candidates:
        ranked = closest_names(unused, group_indices(candidates))
        more = len(ranked) - SHOWN_CANDIDATES
        listing = f"candidates, closest first: {', '.join(ranked[:SHOWN_CANDIDATES])}" + (f" (and {more} more)" if more > 0 else "")
    else:
        listing = f"{model_name} has none"
    return RuleMatchError(
        f"{rule.argument} entries {unused} match no module of {model_name} that can be tensorized; {listing}. "
        "A list entry is a module's name or a dotted suffix of it; a string is a regular expression matching whole names."
    )


def group_indices(names: Iterable[str]) -> list[str]:
    """Names that differ only in one numeric part, written once: ``layers.{0..11}.query`` (order of first appearance)."""
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    for name in names:
        parts = name.split(".")
        groups.setdefault(tuple("#" if p.isdigit() else p for p in parts), []).append(parts)
    out: list[str] = []
    for members in groups.values():
        varying = [i for i in range(len(members[0])) if len({m[i] for m in members}) > 1]
        if len(members) == 1 or len(varying) != 1:
            out += [".".join(m) for m in members]
            continue
        values = sorted({int(m[varying[0]]) for m in members})
        contiguous = values == list(range(values[0], values[-1] + 1)) and len(values) > 2
        parts = list(members[0])
        parts[varying[0]] = f"{{{values[0]}..{values[-1]}}}" if contiguous else "{" + ",".join(map(str, values)) + "}"
        out.append(".".join(parts))
    return out
