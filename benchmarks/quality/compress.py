r"""Compressing a trained model: CoMERA against the plain paths a user would write instead (issue #52).

A causal LM (``ModelSpec``, default a Llama of width 64 and 4 blocks on the code corpus) is trained dense for
``--train-steps`` (AdamW, warm-up + cosine), then, from those weights, each system trains ``--extra`` more steps
(a fraction of the training steps) at ``--ft-lr``, in one process, same data and seed:

* ``comera``: ``ComeraCallback(tensorize=TensorizeConfig(init="svd"), budget=BudgetConfig(compression=C))``, the two
  lines a user adds (plus ``--comera`` / ``--tensorize`` overrides);
* ``svd``: every layer CoMERA tensorized replaced by its truncated SVD as plain factors at the rank CoMERA ended with
  (the same parameters per layer), not trained;
* ``svd_ft``: the same, fine-tuned the same extra steps (the plain path: SVD + fine-tuning);
* ``svd_ft_uniform``: SVD + fine-tuning with one rank for every layer CoMERA tensorized, their factors holding
  about CoMERA's parameters in them (``uniform_ranks_of``): the plain path as a user writes it by hand;
* ``svd_ft_distill``: that with the trained model as teacher, as CoMERA's ``--comera 'distill={...}'`` (required);
* ``asvd_ft``: the same with activation-aware SVD (each input feature weighted by its mean |activation|^0.5 on 8
  training batches, ASVD), fine-tuned;
* ``fwsvd_ft``: the same with Fisher-weighted SVD (each output feature weighted by √ of its summed squared loss
  gradients on 8 training batches, FWSVD), fine-tuned;
* ``kfac_ft``: the same with K-FAC-whitened SVD (each layer's SVD taken of ``G^½ W A^½``, its inputs' and its outputs'
  gradients' second moments on 8 training batches: the truncation the loss feels least), fine-tuned;
* ``svd_ft_measured``, ``kfac_ft_measured``: SVD and K-FAC-whitened SVD + fine-tuning at ranks measured before the
  first step (``measured_ranks``: each layer cut alone, its loss on 4 more training batches; the ranks then bought
  by loss per weight up to CoMERA's size): a one-shot data-aware path that needs CoMERA's size, not its ranks;
* ``prune_ft``: ``torch.nn.utils.prune`` global magnitude pruning of the same layers' weights to the weights CoMERA
  kept (nonzeros; unstructured), fine-tuned with the masks;
* ``dense_ft``: the dense model trained the same extra steps (what compression costs);
* ``small``: a dense model of CoMERA's final size (narrower) trained from scratch for all the steps.

    python -m benchmarks.quality.compress --compressions 2,4 --out benchmarks/results/compress_llama64.json
    python -m benchmarks.quality.compress --check     # a tiny model, a few steps: the pipeline runs
    python -m benchmarks.quality.compress --no-served    # skip exporting each model (default: file bytes, batch-1/32 ms; served.py)

The trained dense weights are cached (``--cache``) so that several compress runs share one training.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import sys
from typing import Any

from benchmarks.probes import RESULTS, machine_basics, write_result
from benchmarks.quality.baselines import distilled_output_
from benchmarks.quality.models import ModelSpec, narrow_width, svd_factors_, svd_ranks_of, uniform_ranks_of
from benchmarks.quality.runs import fit, print_result
from benchmarks.quality.settings import RaceSettings, _options, check_teacher, default_systems
from benchmarks.quality.weights_cache import add_run_arguments, apply_check, load_or_train

SYSTEMS = ("comera", "svd", "svd_ft", "svd_ft_uniform", "svd_ft_distill", "asvd_ft", "fwsvd_ft", "kfac_ft",
           "svd_ft_measured", "kfac_ft_measured", "prune_ft", "dense_ft", "small")
CALIBRATION_BATCHES = 8
HELD_BATCHES = 4  # the batches measured_ranks measures each cut's loss on, after the calibration ones
CHECK = {"model": "llama:32:1", "train_steps": 16, "epochs": 2, "batch_size": 4, "block_size": 32, "vocab_size": 300,
         "max_bytes": 300_000, "val_batches": 2, "ft_epochs": 2}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama:64:4", help="family:width:layers")
    parser.add_argument("--train-steps", type=int, default=1080, help="steps of the dense training")
    parser.add_argument("--extra", type=float, default=0.25, help="compress steps, as a fraction of --train-steps")
    parser.add_argument("--compressions", default="2,4", help="compressions of the tensorized layers, comma-separated")
    parser.add_argument("--systems", default=default_systems(SYSTEMS),
                        help=f"comma-separated, from {','.join(SYSTEMS)} (svd_ft_distill only when named)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak LR of the dense training (and of small)")
    parser.add_argument("--ft-lr", type=float, default=3e-4, help="peak LR of the compress runs")
    parser.add_argument("--epochs", type=int, default=8, help="validations of the dense training")
    parser.add_argument("--ft-epochs", type=int, default=4, help="validations of a compress run (one per epoch)")
    for name, default in (("batch_size", 32), ("block_size", 128), ("vocab_size", 512), ("max_bytes", 6_000_000),
                          ("val_batches", 16), ("seed", 0), ("threads", 2)):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--comera", nargs="*", default=[], help="ComeraCallback / BudgetConfig options, key=value")
    parser.add_argument("--tensorize", nargs="*", default=[], help="TensorizeConfig fields, key=value")
    add_run_arguments(parser, "compress_<model>.json", "a tiny model and a few steps: the pipeline runs")
    args = parser.parse_args(argv)
    apply_check(args, CHECK, "compress")
    unknown = sorted(set(args.systems.split(",")) - set(SYSTEMS))
    if unknown:
        parser.error(f"--systems: unknown {unknown}; choose from {','.join(SYSTEMS)}")
    check_teacher(parser, args.systems.split(","), args.comera, "--comera")
    return args


def settings_for(args: argparse.Namespace, steps: int, epochs: int, lr: float) -> RaceSettings:
    """The race's settings for one phase (``steps`` at peak ``lr``, ``epochs`` validations)."""
    return RaceSettings(steps=steps, epochs=epochs, batch_size=args.batch_size, block_size=args.block_size,
                        vocab_size=args.vocab_size, max_bytes=args.max_bytes, val_batches=args.val_batches, lr=lr,
                        seed=args.seed, threads=args.threads, comera=_options(args.comera),
                        tensorize={"init": "svd", **_options(args.tensorize)})


def trained_dense(args: argparse.Namespace, spec: ModelSpec, data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dense model trained ``--train-steps`` (from the cache when it holds this very run): (weights, result)."""
    key = f"{spec.label()}_s{args.train_steps}_b{args.batch_size}x{args.block_size}_v{args.vocab_size}_lr{args.lr:g}_seed{args.seed}"

    def train() -> tuple[dict[str, Any], Any]:
        result, module = fit("dense", spec, settings_for(args, args.train_steps, args.epochs, args.lr), data,
                             lr=args.lr, steps=args.train_steps)
        print_result(result)
        return result, module.model

    state, result, _ = load_or_train(args.cache / f"{key}.pt", train)
    return state, result


def validate(module: Any, data: Any, settings: RaceSettings) -> float:
    """The validation loss of ``module`` as it is (no training)."""
    import lightning as L

    trainer = L.Trainer(limit_val_batches=settings.val_batches, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    return float(trainer.validate(module, datamodule=data, verbose=False)[0]["val/loss"])


def compress_at(args: argparse.Namespace, spec: ModelSpec, data: Any, state: dict[str, Any], compression: float,
                systems: list[str], total_steps: int) -> dict[str, dict[str, Any]]:
    """Every system of ``systems`` at one compression, from the trained ``state``."""
    from comera_lightning import BudgetConfig

    extra = max(args.ft_epochs, round(args.extra * args.train_steps) // args.ft_epochs * args.ft_epochs)
    settings = settings_for(args, extra, args.ft_epochs, args.ft_lr)
    budget = {k: v for k, v in settings.comera.items() if k in BudgetConfig.option_names()}
    settings.comera = {"budget": BudgetConfig(compression=compression, **budget),
                       **{k: v for k, v in settings.comera.items() if k not in budget}}
    results: dict[str, dict[str, Any]] = {}
    comera, module = fit("comera", spec, settings, data, lr=args.ft_lr, steps=extra, start_from=copy.deepcopy(state))
    ranks = svd_ranks_of(module.model)
    results["comera"] = {**comera, "ranks": ranks}
    modules = {"comera": module}
    if "svd" in systems:
        plain = trained_model(args, spec, data, state, svd_ranks=ranks)
        results["svd"] = {"system": "svd", "final_val_loss": round(validate(plain, data, settings), 4),
                          "parameters": sum(p.numel() for p in plain.parameters())}
    if "svd_ft" in systems:
        results["svd_ft"], modules["svd_ft"] = fit("svd_ft", spec, settings, data, lr=args.ft_lr, steps=extra,
                                                   start_from=copy.deepcopy(state), svd_ranks=ranks)
    if "svd_ft_uniform" in systems:
        uniform = uniform_ranks_of(module.model)
        results["svd_ft_uniform"], modules["svd_ft_uniform"] = fit(
            "svd_ft_uniform", spec, settings, data, lr=args.ft_lr, steps=extra, start_from=copy.deepcopy(state), svd_ranks=uniform)
        results["svd_ft_uniform"]["rank"] = next(iter(uniform.values()))
    if "svd_ft_distill" in systems:
        def taught_then_factored(model: Any) -> None:  # the teacher copies the dense model before it is factored
            distilled_output_(model, _options(args.comera)["distill"])
            svd_factors_(model, ranks)

        results["svd_ft_distill"], modules["svd_ft_distill"] = fit(
            "svd_ft_distill", spec, settings, data, lr=args.ft_lr, steps=extra, start_from=copy.deepcopy(state),
            transform=taught_then_factored)
    results.update(plain_baselines(args, spec, data, state, ranks, systems, settings, extra, modules))
    if args.served:  # after every fit: the timings run with nothing else in the process
        from benchmarks.quality.served import served

        for name, trained in modules.items():
            results[name]["served"] = served(trained.model, args.block_size, data.vocab_size)
    if "small" in systems:
        width = narrow_width(spec, comera["parameters"], data.vocab_size, args.block_size, 8)
        results["small"], _ = fit("small", spec.with_width(width), settings_for(args, total_steps, args.epochs, args.lr),
                                  data, lr=args.lr, steps=total_steps)
    for name, result in results.items():
        result.pop("layer_sizes", None)
        if "curve" in result:
            print_result(result)
        else:
            print(f"{spec.label()} {name:10s} val loss {result['final_val_loss']:.4f} params {result['parameters']:,}",
                  file=sys.stderr, flush=True)
    return results


def trained_model(args: argparse.Namespace, spec: ModelSpec, data: Any, state: dict[str, Any], **options: Any) -> Any:
    """A fresh ``CausalLM`` holding the trained dense weights (then ``options``, e.g. ``svd_ranks``), configured."""
    from benchmarks.quality.lm import CausalLM

    module = CausalLM(spec, data.vocab_size, args.block_size, start_from=copy.deepcopy(state), **options)
    module.configure_model()
    return module


def plain_baselines(args: argparse.Namespace, spec: ModelSpec, data: Any, state: dict[str, Any], ranks: dict[str, int],
                    systems: list[str], settings: RaceSettings, extra: int, modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """ASVD, FWSVD, K-FAC SVD (at CoMERA's ranks and at measured ones) and magnitude pruning, each + fine-tuning at
    CoMERA's sizes, those of ``systems`` asked (their trained modules added to ``modules``)."""
    import functools
    import itertools

    from benchmarks.quality.baselines import (activation_scales, asvd_factors_, fisher_scales, fwsvd_factors_, kept_weights,
                                              kfac_factors_, kfac_statistics, magnitude_prune_, measured_ranks,
                                              nonzero_parameters)

    results: dict[str, dict[str, Any]] = {}
    if not {"asvd_ft", "fwsvd_ft", "kfac_ft", "svd_ft_measured", "kfac_ft_measured", "prune_ft"} & set(systems):
        return results
    dense = trained_model(args, spec, data, state).model.eval()
    loss_of = lambda model, batch: model(**batch).loss
    batches = list(itertools.islice(data.train_dataloader(), CALIBRATION_BATCHES + HELD_BATCHES))  # the same each call
    calibration, held = batches[:CALIBRATION_BATCHES], batches[CALIBRATION_BATCHES:]
    kfac = functools.cache(lambda: kfac_statistics(dense, ranks, calibration, loss_of))  # kfac_ft's and the measured paths'
    calibrations = {  # each weighted SVD: its scales from the dense model on calibration batches, and its factors
        "asvd_ft": (lambda: activation_scales(dense, ranks, calibration), asvd_factors_),
        "fwsvd_ft": (lambda: fisher_scales(dense, ranks, calibration, loss_of), fwsvd_factors_),
        "kfac_ft": (kfac, kfac_factors_),
    }
    for system in [s for s in calibrations if s in systems]:
        calibrate, factors_ = calibrations[system]
        scales = calibrate()
        results[system], modules[system] = fit(system, spec, settings, data, lr=args.ft_lr, steps=extra, start_from=copy.deepcopy(state),
                                               transform=lambda model: factors_(model, ranks, scales))
    if {"svd_ft_measured", "kfac_ft_measured"} & set(systems):
        statistics = kfac()
        measured = measured_ranks(dense, statistics, kept_weights(ranks, dense), held, loss_of)
        truncations = {"svd_ft_measured": lambda model: svd_factors_(model, measured),
                       "kfac_ft_measured": lambda model: kfac_factors_(model, measured, statistics)}
        for system in [s for s in truncations if s in systems]:
            results[system], modules[system] = fit(system, spec, settings, data, lr=args.ft_lr, steps=extra,
                                                   start_from=copy.deepcopy(state), transform=truncations[system])
            results[system]["ranks"] = measured
    if "prune_ft" in systems:
        keep = kept_weights(ranks, dense)
        results["prune_ft"], modules["prune_ft"] = fit("prune_ft", spec, settings, data, lr=args.ft_lr, steps=extra,
                                                       start_from=copy.deepcopy(state), transform=lambda model: magnitude_prune_(model, ranks, keep))
        results["prune_ft"]["parameters"] = nonzero_parameters(modules["prune_ft"])  # the pruned weights by their nonzeros
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.quality.race import data_module

    args = parse_args(argv)
    spec = ModelSpec.parse(args.model)
    systems = args.systems.split(",")
    data = data_module(settings_for(args, args.train_steps, args.epochs, args.lr))
    state, dense = trained_dense(args, spec, data)
    extra = round(args.extra * args.train_steps)
    out: dict[str, Any] = {"benchmark": "compress", "machine": machine_basics(), "date": datetime.date.today().isoformat(),
                           "args": {k: v for k, v in vars(args).items() if k not in ("cache", "out")},
                           "dense": dense, "by_compression": {}}
    if args.served:
        import torch

        from benchmarks.quality.served import served

        torch.set_num_threads(args.threads)  # as every fit's timing runs: dense's must not use more threads than theirs
        out["dense"]["served"] = served(trained_model(args, spec, data, state).model, args.block_size, data.vocab_size)
    if "dense_ft" in systems:
        settings = settings_for(args, extra, args.ft_epochs, args.ft_lr)
        out["dense_ft"], _ = fit("dense_ft", spec, settings, data, lr=args.ft_lr, steps=settings.steps,
                                 start_from=copy.deepcopy(state))
        out["dense_ft"].pop("layer_sizes", None)
        print_result(out["dense_ft"])
    for compression in (float(c) for c in args.compressions.split(",")):
        out["by_compression"][f"{compression:g}"] = compress_at(args, spec, data, state, compression, systems,
                                                                args.train_steps + extra)
    write_result(args.out or RESULTS / f"compress_{spec.label()}.json", out, table(out))
    return out


def table(out: dict[str, Any]) -> str:
    """Validation loss per system and compression, the dense model's beside them (markdown)."""
    lines = [f"dense trained: {out['dense']['final_val_loss']:.4f}"
             + (f"; dense + the extra steps: {out['dense_ft']['final_val_loss']:.4f}" if "dense_ft" in out else ""),
             "", "| compression | " + " | ".join(s for s in SYSTEMS if s != "dense_ft") + " |",
             "|---|" + "---|" * (len(SYSTEMS) - 1)]
    for compression, results in out["by_compression"].items():
        cells = [f"{results[s]['final_val_loss']:.4f}" if s in results else "–" for s in SYSTEMS if s != "dense_ft"]
        lines.append(f"| {compression}x | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
