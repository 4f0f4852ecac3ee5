"""The CLI's argument parser: no abbreviated options, one-line errors naming the closest valid keys, full help.

argparse would expand ``--trainer.max_epoch`` to ``--trainer.max_epochs`` (abbreviations) and answer a
typo with the full usage, dozens of lines; this parser refuses the first and answers the second with
``error: ... (did you mean ...?)`` on one line and exit status 2. Its ``--help`` also lists the options
of a nested dataclass argument (``--comera.tensorize.max_rank``, ...), which jsonargparse shows only
under ``--comera.tensorize.help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import inspect
import re
import sys
import types
from collections.abc import Iterable
from typing import Any, NoReturn, Union, get_args, get_origin

from lightning.pytorch.cli import LightningArgumentParser

__all__ = ["ComeraArgumentParser", "closest_keys", "one_line_error"]

_QUOTED = re.compile(r"""["']([A-Za-z_][\w.\-]*)["']""")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (\S+)")
_CLASS_PATH = re.compile(r"class_path '([\w.]+)'")
_NOISE = ("Given value", "Subtypes:", "Errors:", "Does not validate", "Expected a <class 'NoneType'>", "Problem with given class_path")


class ComeraArgumentParser(LightningArgumentParser):
    """LightningArgumentParser with ``allow_abbrev=False`` and one-line errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        sys.stderr.write(one_line_error(message, _known_keys(parser)) + "\n")
        sys.exit(2)

    def format_help(self, *args: Any) -> str:
        """The help, with each nested dataclass argument's own options right after the group that holds it."""
        saved = self._action_groups
        groups = []
        for group in saved:
            groups.append(group)
            for action in group._group_actions:
                nested = _nested_dataclass(action)
                if nested is not None:
                    groups.append(self._nested_group(action.dest, nested))
        self._action_groups = groups
        try:
            return super().format_help(*args)
        finally:
            self._action_groups = saved

    def _nested_group(self, dest: str, cls: type) -> Any:
        """The options ``--<dest>.<field>`` of dataclass ``cls`` as one help group (defaults: the parser's, config files included)."""
        sub = type(self)(add_help=False)
        sub.add_class_arguments(cls, dest)
        group = next(g for g in sub._action_groups if any(a.dest.startswith(dest + ".") for a in g._group_actions))
        group._group_actions = [a for a in group._group_actions if a.dest.startswith(dest + ".")]
        group.title = f"{group.title} (--{dest}.*)"
        given = _field_values(next(a.default for a in self._actions if a.dest == dest))  # e.g. a config's, for --help
        for action in group._group_actions:
            field = action.dest[len(dest) + 1:]
            if field in given:
                action.default = given[field]
        return group


def _field_values(value: Any) -> dict[str, Any]:
    """The fields set by a nested dataclass argument's default: a dataclass, a dict or a (class_path, init_args) namespace."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "as_dict"):  # jsonargparse's Namespace
        value = value.as_dict()
    if isinstance(value, dict):
        return dict(value.get("init_args", value))
    return {}


def _nested_dataclass(action: Any) -> type | None:
    """The dataclass of an argument typed ``SomeDataclass`` or ``SomeDataclass | None``, else None."""
    if action.default == argparse.SUPPRESS:  # --x.help: a typehint too, but it takes no value
        return None
    hint = getattr(action, "_typehint", None)  # jsonargparse's typed arguments
    members = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    classes = [t for t in members if isinstance(t, type) and dataclasses.is_dataclass(t)]
    others = [t for t in members if t is not type(None) and t not in classes]
    return classes[0] if len(classes) == 1 and not others else None


def _known_keys(parser: Any) -> list[str]:
    """Every option of ``parser`` and of its subcommands' parsers, without the leading dashes."""
    keys: set[str] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            keys.update(opt.lstrip("-") for opt in action.option_strings if opt.startswith("--") and not opt.endswith("+"))
            stack.extend(getattr(action, "_name_parser_map", {}).values())
    return sorted(keys)


def closest_keys(key: str, known: Iterable[str], n: int = 2) -> list[str]:
    """The valid keys closest to a misspelt ``key`` (whole dotted key, then its last part under the same section)."""
    known = list(known)
    found = difflib.get_close_matches(key, known, n=n, cutoff=0.75)
    if not found and "." in key:
        section, leaf = key.rsplit(".", 1)
        siblings = {k.rsplit(".", 1)[1]: k for k in known if k.rsplit(".", 1)[0] == section}
        found = [siblings[m] for m in difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)]
    return found


def _class_arguments(message: str) -> list[str]:
    """The init arguments of the class a jsonargparse message names (``Problem with given class_path '...'``)."""
    found = _CLASS_PATH.search(message)
    if not found:
        return []
    module, _, name = found.group(1).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except (ImportError, AttributeError, TypeError, ValueError):
        return []


def _key_line(message: str) -> str:
    """The line of a (possibly nested, many-line) jsonargparse message that says what is wrong."""
    lines = [re.sub(r"^- ", "", ln.strip()) for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return "invalid arguments"
    useful = [ln for ln in lines[1:] if not ln.startswith(_NOISE)]
    if len(lines) == 1 or not useful:
        return lines[0]
    said = useful[:1]
    for line in useful[1:]:  # a nested key ("Parser key "cut":") is followed by what is wrong with its value
        if not said[-1].endswith(":"):
            break
        said.append(line)
    return f"{lines[0].rstrip(':')}: {' '.join(said)}"


def one_line_error(message: str, known: Iterable[str]) -> str:
    """``error: <what is wrong>`` on one line, plus the closest valid keys of a key it names."""
    unknown = _UNRECOGNIZED.search(message)
    text = _key_line(message)
    candidates = [unknown.group(1).lstrip("-")] if unknown else _QUOTED.findall(text)
    known = [*known, *_class_arguments(message)]
    for key in candidates:
        if key in known:
            continue
        near = closest_keys(key, known)
        if near:
            return f"error: {text} (did you mean {' or '.join(near)}?)"
    return f"error: {text}"
