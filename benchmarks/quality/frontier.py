r"""The frontier race: validation loss against parameters, CoMERA's adaptive ranks against what else fits each size.

For each size asked (``--budgets``: the tensorized layers that many times smaller than dense), in one process, same
data, seed, steps and LR, on the race's models (``race.py``):

* ``comera``: ``ComeraCallback(budget=BudgetConfig(compression=c))``: it starts at twice the size asked and the late
  stage decides which ranks go (the least important first, docs/METHOD.md §2.3);
* ``fixed``: the same layers at uniform ranks of the size asked the whole time (``adapt=False``), same step rule;
* ``narrow``: a dense model of the same family whose width gives CoMERA's final parameter count;
* ``lowrank``: the layers CoMERA tensorized as plain ``U·V`` of one rank, the largest that fits CoMERA's final size;

and ``dense`` once. Reported (JSON, a markdown table, a PNG of validation loss against parameters, one curve per
system): each run's final validation loss, parameters and the size CoMERA reached against the size asked.

    python -m benchmarks.quality.frontier --quick
    python -m benchmarks.quality.frontier --models llama:64:4 --vocab-size 261 --budgets 2,4,8,16 --tokens-per-param 5 \
        --batch-size 32 --lr 1e-3 --out benchmarks/results/frontier_llama64.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import RESULTS, without_out
from benchmarks.quality.models import ModelSpec, dense_parameters, narrow_width
from benchmarks.quality.race import data_module, run_header
from benchmarks.quality.runs import fit, print_result
from benchmarks.quality.settings import QUICK, QUICK_MODELS, RaceSettings, _numbers

SYSTEMS = ("comera", "fixed", "narrow", "lowrank")


def _settings_with_budget(settings: RaceSettings, compression: float, adapt: bool) -> RaceSettings:
    budget = {**settings.comera.get("budget", {}), "compression": compression, "adapt": adapt}
    return dataclasses.replace(settings, comera={**settings.comera, "budget": budget})


def _trim(result: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A run's result with the parameters of ``names`` (the layers CoMERA tensorized) as its compressible ones."""
    sizes = result.pop("layer_sizes")
    tensorized = result["system"] in ("comera", "fixed")
    result["compressible_parameters"] = result["tt_parameters"] if tensorized else sum(sizes.get(n, 0) for n in names)
    return result


def at_budget(spec: ModelSpec, settings: RaceSettings, data: Any, compression: float, steps: int) -> dict[str, Any]:
    """Every system of the frontier at one size asked."""
    from comera_lightning.rank import tt_layers

    results: dict[str, Any] = {}
    adaptive, module = fit("comera", spec, _settings_with_budget(settings, compression, True), data, lr=settings.lr, steps=steps)
    names, budget = [n for n, _ in tt_layers(module.model)], adaptive["tt_parameters"]
    results["comera"] = {**adaptive, "tensorized_layers": names}
    fixed, _ = fit("comera", spec, _settings_with_budget(settings, compression, False), data, lr=settings.lr, steps=steps)
    results["fixed"] = {**fixed, "system": "fixed"}
    width = narrow_width(spec, adaptive["parameters"], data.vocab_size, settings.block_size, settings.narrow_multiple)
    results["narrow"], _ = fit("narrow", spec.with_width(width), settings, data, lr=settings.lr, steps=steps)
    lowrank, low = fit("lowrank", spec, settings, data, lr=settings.lr, steps=steps, low_rank=(names, budget))
    results["lowrank"] = {**lowrank, "low_rank_rank": low.rank}
    for result in results.values():
        print_result(result)
        _trim(result, names)
    return results


def markdown(results: dict[str, Any]) -> str:
    """One row per (model, size asked, system): parameters, compressible parameters, final loss vs dense."""
    lines = ["| model | asked | system | parameters | compressible (x smaller than dense) | val loss (vs dense) |",
             "|---|---|---|---|---|---|"]
    for model, entry in results["models"].items():
        dense = entry["dense"]
        lines.append(f"| {model} | – | dense | {dense['parameters']:,} | {dense['compressible_parameters']:,} | "
                     f"{dense['final_val_loss']:.3f} |")
        for asked, systems in entry["budgets"].items():
            for name, run in systems.items():
                smaller = dense["compressible_parameters"] / max(1, run["compressible_parameters"])
                versus = 100 * (run["final_val_loss"] / dense["final_val_loss"] - 1)
                lines.append(f"| {model} | {asked}x | {name} | {run['parameters']:,} | {run['compressible_parameters']:,} "
                             f"({smaller:.1f}x) | {run['final_val_loss']:.3f} ({versus:+.1f} %) |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Path:
    """Validation loss against parameters, one curve per system, one panel per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(5.4 * len(models), 4.4), squeeze=False)
    for ax, (model, entry) in zip(axes[0], models.items()):
        for name in SYSTEMS:
            runs = sorted((run["parameters"], run["final_val_loss"]) for systems in entry["budgets"].values()
                          for key, run in systems.items() if key == name)
            ax.plot([p for p, _ in runs], [v for _, v in runs], marker="o", label=name)
        ax.scatter([entry["dense"]["parameters"]], [entry["dense"]["final_val_loss"]], marker="*", s=120, color="k", label="dense")
        ax.set_xscale("log")
        ax.set_title(model, fontsize=10)
        ax.set_xlabel("parameters at the end")
        ax.set_ylabel("validation loss (nats/token)")
        ax.legend(fontsize=7)
    fig.suptitle("Frontier: validation loss against parameters (CPU)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=QUICK_MODELS)
    parser.add_argument("--budgets", default="2,4,8,16", help="sizes asked: the tensorized layers that many times smaller")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MODELS}, budgets 4,8, {QUICK['steps']} steps, small data")
    for name, kind in (("steps", int), ("epochs", int), ("batch_size", int), ("block_size", int), ("vocab_size", int),
                       ("max_bytes", int), ("val_batches", int), ("lr", float), ("tokens_per_param", float),
                       ("warmup", float), ("min_lr", float), ("weight_decay", float), ("narrow_multiple", int)):
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if k in {f.name for f in dataclasses.fields(RaceSettings)} and v is not None}
    settings = RaceSettings(**{**(QUICK if args.quick else {}), **given})
    budgets = _numbers("4,8" if args.quick and args.budgets == "2,4,8,16" else args.budgets, float)
    started = time.perf_counter()
    data = data_module(settings)
    results = run_header("python -m benchmarks.quality.frontier " + " ".join(without_out(argv)), settings, data)
    for spec in [ModelSpec.parse(m) for m in args.models.split(",")]:
        steps = settings.steps_for(dense_parameters(spec, data.vocab_size, settings.block_size))
        dense, _ = fit("dense", spec, settings, data, lr=settings.lr, steps=steps)
        print_result(dense)
        entry = {"steps": steps, "budgets": {}}
        for compression in budgets:
            entry["budgets"][f"{compression:g}"] = at_budget(spec, settings, data, compression, steps)
        names = entry["budgets"][f"{budgets[0]:g}"]["comera"]["tensorized_layers"]
        entry["dense"] = _trim(dense, names)
        results["models"][spec.label()] = entry
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    out = args.out or RESULTS / f"frontier{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out.with_suffix(".png"))
    print(markdown(results))
    print(f"\nwrote {out} and {out.with_suffix('.png')}", file=sys.stderr)


if __name__ == "__main__":
    main()
