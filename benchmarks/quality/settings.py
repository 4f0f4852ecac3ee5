"""The race's settings and command line: data, schedule, budget, LR sweep and seeds shared by every system."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

SYSTEMS = ("dense", "comera", "narrow", "lowrank", "galore", "dense_time")
NEEDS = {"narrow": ("comera",), "lowrank": ("comera",), "dense_time": ("dense", "comera")}
FULL_MODELS = "llama:256:4,gpt2:256:4,llama:512:4,gpt2:512:4"
QUICK = {"steps": 60, "epochs": 4, "batch_size": 8, "block_size": 64, "vocab_size": 1024, "max_bytes": 1_500_000,
         "val_batches": 8}
QUICK_MODELS = "llama:128:2"


@dataclass
class RaceSettings:
    """Data, schedule and budget shared by every system of a race.

    ``tokens_per_param`` (> 0) sets each model's steps from its dense parameter count instead of ``steps``
    (20: the compute-optimal budget). ``lrs``: the peak learning rates every system is trained at (empty: ``lr``
    alone); the headline compares each system at its best. ``seeds``: further seeds for ``seed_systems`` at their
    best LR (the spread of the headline rows). The schedule: linear warm-up over ``warmup`` of the steps, then
    cosine to ``min_lr`` times the peak. A step is ``accumulate`` batches of ``batch_size`` blocks; ``gradient_clip``
    (> 0) clips the gradients' norm. ``one_pass``: the training data is read on across validations (``epochs`` of
    them, evenly spaced) instead of one reshuffled epoch per validation. ``data_files`` (``val_files``,
    ``tokenizer_file``, ``text_field``): text files to train on instead of the code corpus (``race.data_module``).
    """

    steps: int = 400
    epochs: int = 8
    batch_size: int = 16
    block_size: int = 128
    vocab_size: int = 4096
    max_bytes: int = 6_000_000
    val_batches: int = 16
    lr: float = 1e-3
    lrs: list[float] = field(default_factory=list)
    tokens_per_param: float = 0.0
    warmup: float = 0.05
    min_lr: float = 0.0
    weight_decay: float = 0.0
    accumulate: int = 1
    gradient_clip: float = 0.0
    device: str = "cpu"
    precision: str = "32-true"
    one_pass: bool = False
    seed: int = 0
    seeds: list[int] = field(default_factory=list)
    seed_systems: list[str] = field(default_factory=lambda: ["dense", "comera"])
    threads: int = 1
    narrow_multiple: int = 16
    comera: dict[str, Any] = field(default_factory=dict)
    tensorize: dict[str, Any] = field(default_factory=dict)
    galore: dict[str, Any] = field(default_factory=dict)
    data_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    tokenizer_file: str | None = None
    text_field: str = "text"

    @property
    def swept_lrs(self) -> list[float]:
        return list(self.lrs) or [self.lr]

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step: ``accumulate`` batches of ``batch_size`` blocks of ``block_size``."""
        return self.accumulate * self.batch_size * self.block_size

    def steps_for(self, dense_parameters: int) -> int:
        """Optimizer steps of a model with ``dense_parameters``: ``steps``, or ``tokens_per_param`` tokens per parameter,
        rounded to a whole number of steps per epoch."""
        if self.tokens_per_param <= 0:
            return self.steps
        per_epoch = max(1, round(self.tokens_per_param * dense_parameters / self.tokens_per_step / self.epochs))
        return per_epoch * self.epochs


def _options(pairs: list[str]) -> dict[str, Any]:
    """``["gate_lr=0.01", "early_epochs=[3]"]`` -> ``{"gate_lr": 0.01, ...}`` (JSON values, else strings)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _numbers(text: str | None, kind: type) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated {kind.__name__}s, got {text!r}") from None


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data-files``, ``--val-files``, ``--tokenizer-file``, ``--text-field``: text files instead of the code corpus."""
    parser.add_argument("--data-files", nargs="+", default=[], metavar="PATH",
                        help="train on these text files, folders or globs (C4 *.json.gz, *.jsonl[.gz], *.txt) instead of "
                             "the code corpus; the last one validates unless --val-files")
    parser.add_argument("--val-files", nargs="+", default=[], metavar="PATH", help="held-out text files to validate on")
    parser.add_argument("--tokenizer-file", default=None, help="a tokenizer.json with <pad> and </s> (default: a "
                        "byte-level BPE of --vocab-size trained on the training files, cached)")
    parser.add_argument("--text-field", default="text", help="the JSON field that holds a document's text")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The causal-LM quality race (benchmarks/quality/race.py).")
    parser.add_argument("--models", default=None, help=f"family:width:layers, comma-separated (default {FULL_MODELS})")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MODELS}, {QUICK['steps']} steps, small data")
    for f in fields(RaceSettings):
        if f.type in ("int", "float"):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.type == "int" else float, default=None)
    parser.add_argument("--lrs", default=None, help="peak LRs to sweep, comma-separated, e.g. 3e-4,1e-3,3e-3")
    parser.add_argument("--seeds", default=None, help="further seeds for the headline systems at their best LR, e.g. 1,2")
    parser.add_argument("--seed-systems", default=None, help="systems rerun with --seeds (default dense,comera)")
    parser.add_argument("--one-pass", action="store_true", help="read the training data on across validations (the "
                        "anchors' single pass; it repeats only when it holds fewer tokens than the budget)")
    for name, what in (("comera", "ComeraCallback arguments"), ("tensorize", "TensorizeConfig fields"),
                       ("galore", "GaLore group options (rank, update_proj_gap, scale, ...)")):
        parser.add_argument(f"--{name}", nargs="*", default=[], help=f"{what}, key=value (JSON values)")
    add_data_arguments(parser)
    parser.add_argument("--out", type=Path, default=None, help="the JSON (the PNG goes beside it)")
    parser.add_argument("--merge", nargs="+", default=None, help="race JSONs to merge into --out (nothing is trained)")
    args = parser.parse_args(argv)
    args.systems = systems_of(parser, args.systems)
    if args.merge and args.out is None:
        parser.error("--merge needs --out")
    return args


#: The plain path given CoMERA's teacher: in a compress benchmark only when named, and then with a teacher given.
PLAIN_WITH_TEACHER = "svd_ft_distill"


def default_systems(known: tuple[str, ...]) -> str:
    """``--systems``' default: every system but ``PLAIN_WITH_TEACHER`` (it needs a teacher the defaults lack)."""
    return ",".join(s for s in known if s != PLAIN_WITH_TEACHER)


def check_teacher(parser: argparse.ArgumentParser, systems: list[str], options: list[str], flag: str) -> None:
    """A parser error when ``PLAIN_WITH_TEACHER`` is asked for and the ``flag`` options give CoMERA no teacher."""
    if PLAIN_WITH_TEACHER in systems and "distill" not in _options(options):
        parser.error(f"{PLAIN_WITH_TEACHER} is the plain path with CoMERA's teacher: give it as {flag} 'distill={{...}}'")


def systems_of(parser: argparse.ArgumentParser, text: str, known: tuple[str, ...] = SYSTEMS,
               needs: dict[str, tuple[str, ...]] = NEEDS) -> list[str]:
    """The systems of a comma-separated ``--systems``; a parser error for an unknown one or one whose baseline is missing."""
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(known))
    missing = sorted({f"{s} needs {n}: add {n}" for s in systems for n in needs.get(s, ()) if n not in systems})
    if unknown or missing:
        parser.error(f"--systems: unknown {unknown}; choose from {','.join(known)}" if unknown else "; ".join(missing))
    return systems


def settings_of(args: argparse.Namespace) -> RaceSettings:
    given = {f.name: getattr(args, f.name) for f in fields(RaceSettings) if f.type in ("int", "float")
             and getattr(args, f.name) is not None}
    lists = {"lrs": _numbers(args.lrs, float), "seeds": _numbers(args.seeds, int),
             "seed_systems": args.seed_systems.split(",") if args.seed_systems else None}
    settings = RaceSettings(**{**(QUICK if args.quick else {}), **given, **{k: v for k, v in lists.items() if v is not None}},
                            comera=_options(args.comera), tensorize=_options(args.tensorize), galore=_options(args.galore),
                            one_pass=args.one_pass, **data_settings(args))
    return checked(settings)


def data_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``RaceSettings`` fields of ``add_data_arguments``."""
    if args.val_files and not args.data_files:
        raise SystemExit("--val-files needs --data-files (the code corpus holds out files by itself)")
    return {"data_files": args.data_files, "val_files": args.val_files, "tokenizer_file": args.tokenizer_file,
            "text_field": args.text_field}


def checked(settings: RaceSettings) -> RaceSettings:
    """``settings`` with the steps rounded down to whole epochs; a SystemExit naming a value out of range."""
    if settings.accumulate < 1 or settings.gradient_clip < 0:
        raise SystemExit(f"--accumulate must be >= 1 and --gradient-clip >= 0, got {settings.accumulate} and "
                         f"{settings.gradient_clip}")
    if settings.steps < settings.epochs:
        raise SystemExit(f"--steps {settings.steps} is fewer than --epochs {settings.epochs} (one validation per epoch)")
    if settings.steps % settings.epochs:
        settings.steps -= settings.steps % settings.epochs
        print(f"steps rounded down to {settings.steps}, a multiple of {settings.epochs} epochs", file=sys.stderr)
    if not 0 <= settings.warmup < 1 or not 0 <= settings.min_lr <= 1:
        raise SystemExit(f"--warmup must be in [0, 1) and --min-lr in [0, 1], got {settings.warmup} and {settings.min_lr}")
    return settings
