r"""Compressing a trained sentence-pair classifier: CoMERA against the plain paths a user would write instead (issue #52).

``compress.py``'s comparison on the clothing-review pairs (``pairs_frontier``'s DATA) and one of two classifiers
(``--model``, ``pair_models.py``): ``make demo``'s Transformer, or ``examples/huggingface.py``'s Hugging Face BERT; or
on Python source, the package's CodeBERT-like masked LM (``--model codebert``, ``code_models.py``: its accuracy the
masked-token accuracy). The
dense model is trained ``--epochs`` with its own ``configure_optimizers`` (the Transformer: AdamW at a constant 1e-3;
the BERT: AdamW 1e-3 with a cosine over the run, as the example writes it); then, from those weights, each system trains ``--extra`` times the dense steps more
(``max_steps``, validating once per epoch; every reported validation loss is that of the final weights), in one
process, same data and seed:

* ``comera``: ``ComeraCallback(tensorize=TensorizeConfig(init="svd"), budget=BudgetConfig(compression=C))``, the two
  lines a user adds (``--comera key=value``: further BudgetConfig fields);
* ``svd``: every layer CoMERA tensorized replaced by its truncated SVD as plain factors at the rank CoMERA ended with
  (the same parameters per layer), not trained;
* ``svd_ft``: the same, fine-tuned the extra steps (the plain path: SVD + fine-tuning);
* ``svd_ft_distill``: that with the teacher CoMERA was given (``--callback 'distill={...}'``, required);
* ``prune_ft``: ``torch.nn.utils.prune`` global magnitude pruning of the same layers to the weights CoMERA kept
  (parameters counted as nonzeros), fine-tuned the extra steps with the masks;
* ``fixed``: CoMERA at fixed ranks of the size asked (``adapt=False``, ``init="svd"``), fine-tuned the extra steps;
* ``small``: a dense model of CoMERA's final size (narrower: ``PairModel.narrow_width``) trained from scratch for all the steps;
* ``dense_ft`` (once): the dense model trained the extra steps (what compression costs).

    python -m benchmarks.quality.compress_pairs [--model bert] [--compressions 8,32] [--epochs 2] [--extra 0.25] [--out PATH]
    python -m benchmarks.quality.compress_pairs --check     # a few batches: the pipeline runs
    python -m benchmarks.quality.compress_pairs --no-served    # skip exporting each model (default: file bytes, batch-1/32 ms)

The trained dense weights are cached (``--cache``) so that several compress runs share one training.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import sys
from typing import Any

import lightning as L
import torch

from benchmarks.probes import machine_basics
from benchmarks.quality.baselines import (
    distilled_,
    kept_weights,
    magnitude_prune_,
    nonzero_parameters,
)
from benchmarks.quality.compress_common import (
    markdown,
    quiet_fit,
    recorded_command,
    run_systems,
)
from benchmarks.quality.models import svd_factors_, svd_ranks_of
from benchmarks.quality.code_models import CODE_MODELS
from benchmarks.quality.pair_models import PAIR_MODELS, PairLogits, PairModel, pair_inputs
from benchmarks.quality.served import served_program, without_masks
from benchmarks.quality.settings import _options, check_teacher, default_systems, systems_of
from benchmarks.quality.weights_cache import (
    add_run_arguments,
    apply_check,
    load_or_train,
)
from comera_lightning import BudgetConfig, ComeraCallback, TensorizeConfig

SYSTEMS = ("comera", "svd", "svd_ft", "svd_ft_distill", "prune_ft", "fixed", "small", "dense_ft")
NEEDS = {"svd": ("comera",), "svd_ft": ("comera",), "svd_ft_distill": ("comera",), "prune_ft": ("comera",),
         "small": ("comera",)}
CHECK = {"epochs": 2, "limit_batches": 4, "compressions": "8"}
MODELS = {**PAIR_MODELS, **CODE_MODELS}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="transformer",
                        help="the package's Transformer (make demo's), examples/huggingface.py's Hugging Face BERT, or "
                        "the package's CodeBERT-like masked LM on Python source")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the dense training (492 steps each: 984 steps)")
    parser.add_argument("--extra", type=float, default=0.25, help="compress steps, as a fraction of the dense steps")
    parser.add_argument("--compressions", default="8,32", help="compressions of the tensorized layers, comma-separated")
    parser.add_argument("--systems", default=default_systems(SYSTEMS),
                        help=f"comma-separated, from {','.join(SYSTEMS)} (svd_ft_distill only when named)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--comera", nargs="*", default=[], help="BudgetConfig fields of comera and fixed, key=value")
    parser.add_argument("--callback", nargs="*", default=[], help="further ComeraCallback arguments of comera and fixed, "
                        "key=value (JSON values), e.g. core_step_scale=1 'distill={\"module\": \"\"}'")
    parser.add_argument("--tensorize", nargs="*", default=[], help="TensorizeConfig fields of comera and fixed beside "
                        "init='svd', key=value (JSON values)")
    parser.add_argument("--ft-lr", type=float, default=None, help="the LR of every run from the trained weights "
                        "(compress, fine-tune, dense_ft); default: the model's own (1e-3)")
    parser.add_argument("--limit-batches", type=int, default=None, help="batches per epoch and per evaluation (a smoke run)")
    add_run_arguments(parser, "compress_pairs.json", "a few batches of each run: the pipeline runs")
    args = parser.parse_args(argv)
    apply_check(args, CHECK, "compress_pairs")
    systems = systems_of(parser, args.systems, SYSTEMS, NEEDS)
    unknown = sorted(set(_options(args.comera)) - set(BudgetConfig.option_names()))
    if unknown:
        parser.error(f"--comera: unknown {unknown}; BudgetConfig fields are {BudgetConfig.option_names()}")
    check_teacher(parser, systems, args.callback, "--callback")
    return args, systems


def fit(system: str, data: L.LightningDataModule, args: argparse.Namespace, steps: int, *,
        state: dict[str, Any] | None = None, ranks: dict[str, int] | None = None, budget: BudgetConfig | None = None,
        d_model: int | None = None, transform: Any = None, distill: dict[str, Any] | None = None
        ) -> tuple[dict[str, Any], L.LightningModule]:
    """One system: a fresh model (``state`` loaded, its copy the teacher with ``distill``, then ``ranks`` as SVD
    factors, then ``transform``), trained ``steps`` (0: not trained, only evaluated), with CoMERA when ``budget`` is
    given; its validation loss and test accuracy, and the model."""
    L.seed_everything(args.seed, verbose=False)
    kind = MODELS[args.model]
    d_model = d_model or kind.width
    model = kind.build(data, d_model)
    if state is not None:
        model.load_state_dict(copy.deepcopy(state))
        if args.ft_lr is not None:
            kind.set_lr(model, args.ft_lr)
    if distill is not None:
        distilled_(model, distill)
    if ranks:
        svd_factors_(model, ranks)
    if transform is not None:
        transform(model)
    options = _options(args.callback)
    callbacks = [ComeraCallback(tensorize=TensorizeConfig(init="svd", **_options(args.tensorize)), budget=budget,
                                **options)] if budget is not None else []
    trainer, seconds = quiet_fit(model, data, steps, callbacks, args.limit_batches)
    validation = float(trainer.validate(model, datamodule=data, verbose=False)[0]["val/loss"])
    tested = float(trainer.test(model, datamodule=data, verbose=False)[0]["test/acc"])
    result = {"system": system, "d_model": d_model, "parameters": nonzero_parameters(model), "steps": trainer.global_step,
              "val_loss": round(validation, 4), "test_acc": round(tested, 4), "seconds": round(seconds, 1)}
    if args.served and system not in ("dense", "dense_ft", "svd"):
        result["served"] = served_pairs(model, data, MODELS[args.model])
    print(f"  {system:8s} d_model {d_model:3d} parameters {result['parameters']:9,} steps {result['steps']:5d} val loss "
          f"{validation:.4f} test acc {tested:.4f} ({result['seconds']}s)", file=sys.stderr, flush=True)
    return result, model


def dense_steps(data: L.LightningDataModule, args: argparse.Namespace) -> int:
    """The dense training's optimizer steps: ``--epochs`` epochs of the training data (``--limit-batches`` each)."""
    per_epoch = len(data.train_dataloader())
    return args.epochs * (min(per_epoch, args.limit_batches) if args.limit_batches else per_epoch)


def trained_dense(data: L.LightningDataModule, args: argparse.Namespace, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dense model trained ``steps`` (from the cache when it holds this very run): (weights, result)."""
    kind = MODELS[args.model]
    settings = json.dumps({"model": kind.settings, "data": kind.data_settings, "steps": steps, "limit": args.limit_batches}, sort_keys=True)
    key = f"pairs{'' if args.model == 'transformer' else '_' + args.model}_s{steps}_seed{args.seed}_{hashlib.sha1(settings.encode()).hexdigest()[:10]}"
    state, result, cached = load_or_train(args.cache / f"{key}.pt", lambda: fit("dense", data, args, steps))
    if cached:
        print(f"  dense    from the cache: val loss {result['val_loss']:.4f} test acc {result['test_acc']:.4f}",
              file=sys.stderr, flush=True)
        return state, {**result, "cached": True}
    return state, result


def served_pairs(model: L.LightningModule, data: L.LightningDataModule, kind: PairModel) -> dict[str, Any]:
    """``model``'s exported program: file bytes, batch-1/32 ms on inputs as long as the data's (pairs of
    ``max_length`` tokens; a masked LM's blocks of ``block_size``)."""
    pairs = "max_length" in kind.data_settings
    length = kind.data_settings["max_length" if pairs else "block_size"]
    return served_program(PairLogits(without_masks(model)), pair_inputs(data.vocab_size, length, two_sentences=pairs))


def served_dense(state: dict[str, Any], data: L.LightningDataModule, args: argparse.Namespace) -> dict[str, Any]:
    """``served_pairs`` of the dense model holding ``state``."""
    kind = MODELS[args.model]
    model = kind.build(data, kind.width)
    model.load_state_dict(state)
    return served_pairs(model, data, kind)


def compress_at(data: L.LightningDataModule, args: argparse.Namespace, systems: list[str], state: dict[str, Any],
                compression: float, steps: int, extra: int) -> dict[str, dict[str, Any]]:
    """Every system of ``systems`` at one compression, from the trained ``state`` (``steps``: the dense training's)."""
    options = _options(args.comera)
    results: dict[str, dict[str, Any]] = {}
    comera, model = fit("comera", data, args, extra, state=state,
                        budget=BudgetConfig(compression=compression, **options))
    ranks = svd_ranks_of(model)
    results["comera"] = {**comera, "ranks": ranks}
    if "svd" in systems:
        results["svd"], _ = fit("svd", data, args, 0, state=state, ranks=ranks)
    if "svd_ft" in systems:
        results["svd_ft"], _ = fit("svd_ft", data, args, extra, state=state, ranks=ranks)
    if "svd_ft_distill" in systems:
        results["svd_ft_distill"], _ = fit("svd_ft_distill", data, args, extra, state=state, ranks=ranks,
                                           distill=_options(args.callback)["distill"])
    if "prune_ft" in systems:
        kind = MODELS[args.model]
        keep = kept_weights(ranks, kind.build(data, kind.width))
        results["prune_ft"], _ = fit("prune_ft", data, args, extra, state=state,
                                     transform=lambda model: magnitude_prune_(model, ranks, keep))
    if "fixed" in systems:
        fixed = BudgetConfig(compression=compression, **{**options, "adapt": False})
        results["fixed"], _ = fit("fixed", data, args, extra, state=state, budget=fixed)
    if "small" in systems:
        width = MODELS[args.model].narrow_width(data, comera["parameters"])
        results["small"], _ = fit("small", data, args, steps + extra, d_model=width)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, systems = parse_args(argv)
    torch.set_num_threads(1)
    data = MODELS[args.model].data(args.seed)
    data.prepare_data()
    data.setup("fit")
    steps = dense_steps(data, args)
    extra = max(1, round(args.extra * steps))
    out: dict[str, Any] = {
        "benchmark": "compress_pairs", "command": recorded_command("benchmarks.quality.compress_pairs", argv),
        "date": datetime.date.today().isoformat(), "machine": machine_basics(),
        "model_kind": args.model, "model": MODELS[args.model].settings, "data": MODELS[args.model].data_settings,
        "args": {k: v for k, v in vars(args).items() if k not in ("cache", "out")}, "systems": systems,
        "dense_steps": steps, "extra_steps": extra}
    return run_systems(out, args, systems, lambda: trained_dense(data, args, steps),
                       lambda system, extra, state: fit(system, data, args, extra, state=state),
                       lambda state, c: compress_at(data, args, systems, state, c, steps, extra), table, "compress_pairs.json",
                       (lambda state: served_dense(state, data, args)) if args.served else None)


def _cell(run: dict[str, Any], dense: dict[str, Any]) -> str:
    points = 100 * (run["test_acc"] - dense["test_acc"])
    return f"{run['test_acc']:.4f} ({points:+.1f}), {run['val_loss']:.4f}, {run['parameters']:,}"


def table(out: dict[str, Any]) -> str:
    """Test accuracy (points against the trained dense model), validation loss and parameters per system and
    compression (markdown), the dense model's above them."""
    dense = out["dense"]
    kind = out.get("model_kind", "transformer")
    return markdown(out, SYSTEMS, f"Sentence-pair {kind}" if kind in PAIR_MODELS else f"Masked LM {kind}",
                    f"dense trained {out['dense_steps']} steps: test acc {dense['test_acc']:.4f}, val loss "
                    f"{dense['val_loss']:.4f}, {dense['parameters']:,} parameters", _cell,
                    "Test accuracy (points against dense), validation loss, the whole model's parameters; small: dense "
                    "at a smaller d_model, trained from scratch for all the steps.")


if __name__ == "__main__":
    main()
