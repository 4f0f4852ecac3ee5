"""GPU training speed (``make bench-gpu``): dense vs CoMERA, eager / torch.compile / CUDA graphs, bf16-mixed / fp32.

On one CUDA GPU in at most ``--budget`` seconds (default 420: 7 minutes of runs, then the report): the quality race's
Llama at LLaMA-60M's shape, the paper's 6-encoder Transformer, then LLaMA-130M's, -350M's and -1B's shapes as time
allows, each dense and with ``ComeraCallback``'s defaults (and the paper's layout for the Transformer), eager,
``torch.compile``d and under ``CUDAGraphStrategy``, in bf16-mixed and fp32, and eagerly at batch 1 for the peak memory
of one sample (``gpu_runs.py``); and the 1M x 64 TT embedding lookup at rank 32 on
Zipf ids, training and serving, against ``nn.Embedding`` and with the fused kernel against the torch path
(``gpu_lookup.py``); and LLaMA-60M's token table by each lookup route (``token_lookup.py``). Reports steps/s,
tokens/s and ``torch.cuda.max_memory_allocated``, and the ratios that compare like with like: CoMERA over dense in
the same mode and precision, each mode over eager. The cheap rows run first
(eager, graphs and batch 1, bf16 first; compiled rows last, each compiles for tens of seconds); a row that would start after
the budget is listed as not run. Writes JSON and a markdown table naming the device.

Without CUDA it refuses in one line (exit 1). ``--check`` runs the same code on CPU with tiny shapes and two steps
(``torch.compile`` with ``aot_eager``; CUDAGraphStrategy runs eagerly there and the row says so), so that the script
is known to run before anyone spends GPU time (tests/benchmarks/training/test_gpu_speed.py).

    python -m benchmarks.training.gpu_speed [--models llama60m,transformer,llama130m,llama350m,llama1b]
        [--modes eager,graphs,compiled,batch1]
        [--precisions bf16-mixed,32-true] [--steps 20] [--warmup 3] [--budget 420] [--check] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.probes import RESULTS, command_line, machine_basics, write_result
from benchmarks.training.gpu_lookup import lookup_speed
from benchmarks.training.gpu_runs import CHECK_WORKLOADS, MODES, PRECISIONS, SYSTEMS, WORKLOADS, release, timed_fit
from benchmarks.training.token_lookup import route_table, token_lookup

NO_CUDA = ("make bench-gpu: torch sees no CUDA device, and this benchmark times GPU training "
           "(python -m benchmarks.training.gpu_speed --check runs its code path on CPU)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (graphs: 4 more, for the capture)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds after which no further run starts")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--check", action="store_true", help="the same code on CPU, tiny shapes, 2 steps")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_speed[_check].json)")
    args = parser.parse_args(argv)
    chosen = {"models": (args.models, WORKLOADS), "modes": (args.modes, MODES), "precisions": (args.precisions, PRECISIONS)}
    for name, (text, known) in chosen.items():
        values = [v for v in text.split(",") if v]
        unknown = [v for v in values if v not in known]
        if unknown or not values:
            parser.error(f"--{name} {text!r}: unknown {unknown}; choose among {list(known)}")
        setattr(args, name, values)
    if args.check:
        args.steps, args.warmup, args.compile_backend = min(args.steps, 2), min(args.warmup, 1), "aot_eager"
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """(model, system, mode, precision) in the order they run: eager and graphs rows first, bf16 first, compiled last."""
    rows = [(model, system, mode, precision) for mode in args.modes for model in args.models for precision in args.precisions
            for system in SYSTEMS[(CHECK_WORKLOADS if args.check else WORKLOADS)[model].kind]]
    return sorted(rows, key=lambda row: (row[2] == "compiled", args.models.index(row[0]), args.precisions.index(row[3])))


def run_all(args: argparse.Namespace, started: float) -> list[dict[str, Any]]:
    """Every planned run, or its row saying why it did not run; ``--check`` stops at the first error."""
    workloads, rows = CHECK_WORKLOADS if args.check else WORKLOADS, []
    for model, system, mode, precision in plan(args):
        identity = {"model": model, "system": system, "mode": mode, "precision": precision}
        if time.perf_counter() - started > args.budget:
            rows.append({**identity, "note": f"not run: past the {args.budget:.0f} s budget"})
            continue
        print(f"  {model} {system} {mode} {precision} ...", file=sys.stderr, flush=True)
        try:
            rows.append(timed_fit(workloads[model], system, mode, precision, args))
        except Exception as err:  # noqa: BLE001  (one failing configuration must not cost the others their GPU time)
            if args.check:
                raise
            rows.append({**identity, "note": f"failed: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"})
        finally:
            release(compiled=mode == "compiled")
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``x_dense``: steps/s over dense's in the same model, mode and precision; ``x_eager``: over the same run eagerly."""
    speed = {(r["model"], r["system"], r["mode"], r["precision"]): r["steps_per_s"] for r in rows if "steps_per_s" in r}
    for r in rows:
        if "steps_per_s" in r:
            dense = speed.get((r["model"], "dense", r["mode"], r["precision"]))
            eager = speed.get((r["model"], r["system"], "eager", r["precision"]))
            r["x_dense"] = r["steps_per_s"] / dense if dense else None
            r["x_eager"] = r["steps_per_s"] / eager if eager and r["mode"] != "batch1" else None


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(result: dict[str, Any]) -> str:
    """The runs and the lookup as markdown tables, headed by the device and the command."""
    lines = [f"GPU training speed on **{result['machine']['device']}** (torch {result['machine']['torch']}, {result['date']}): "
             f"`{result['command']}`", "",
             "| model | system | mode | precision | steps/s | tokens/s | peak GiB | × dense | × eager | note |", "|" + "---|" * 10]
    for r in result["runs"]:
        lines.append(f"| {r['model']} | {r['system']} | {r['mode']} | {r['precision']} | {_cell(r.get('steps_per_s'), '.2f')} | "
                     f"{_cell(r.get('tokens_per_s'), ',.0f')} | {_cell(r.get('peak_gib'), '.2f')} | {_cell(r.get('x_dense'), '.2f')} | "
                     f"{_cell(r.get('x_eager'), '.2f')} | {r.get('note', '')} |")
    lk = result["lookup"]
    if "error" in lk:
        lines += ["", f"TT embedding lookup failed: {lk['error']}"]
    else:
        lines += _lookup_lines(lk)
    token = result.get("token_lookup")
    if token:
        lines += ["", *(route_table(token) if "error" not in token else [f"Token-table lookup failed: {token['error']}"])]
    return "\n".join(lines) + "\n"


def _lookup_lines(lk: dict[str, Any]) -> list[str]:
    """The 1M x 64 table's lookup (``gpu_lookup.py``) as markdown lines."""
    lines = ["", f"TT embedding {lk['rows']:,} x {lk['dim']} at rank {lk['rank']} ({lk['dense_parameters'] / lk['tt_parameters']:.0f}x "
              f"fewer parameters), {lk['ids']:,} Zipf({lk['zipf_a']}) ids ({lk['distinct_ids']:,} distinct), fused kernel: "
              f"{'yes' if lk['fused_kernel'] else 'no (torch path)'}", "", "| call | ms |", "|---|---|"]
    lines += [f"| {name} | {ms:.3f} |" for name, ms in lk["ms"].items()]
    lines += ["", f"TT over dense: training {lk['tt_over_dense']['train']:.2f}x the time, serving {lk['tt_over_dense']['serve']:.2f}x; "
              f"kernel over torch path: training {lk['kernel_speedup']['train']:.2f}x faster, serving without the cache "
              f"{lk['kernel_speedup']['serve']:.2f}x."]
    if "whole_table_speedup" in lk:  # (runs before 2026-11-30's whole-table route have none)
        lines[-1] += f" Training through the whole table: {lk['whole_table_speedup']:.2f}x the layers' own choice's speed."
    return lines


def _or_error(what: str, measure: Callable[[], dict[str, Any]], check: bool) -> dict[str, Any]:
    """``measure()``'s result, or the error it raised in one line (``--check`` raises it): the training rows still
    run, and ``COMERA_FUSED_KERNELS=0`` rules the kernels out."""
    print(f"  {what} ...", file=sys.stderr, flush=True)
    try:
        return measure()
    except Exception as err:  # noqa: BLE001
        if check:
            raise
        return {"error": f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if not args.check and not torch.cuda.is_available():
        sys.exit(NO_CUDA)
    started = time.perf_counter()
    device = "cpu (--check)" if args.check else torch.cuda.get_device_name()
    result: dict[str, Any] = {"command": command_line(argv), "date": datetime.date.today().isoformat(), "config": vars(args),
                              "machine": {**machine_basics(), "device": device, "torch": torch.__version__}}
    result["lookup"] = _or_error("the TT embedding lookup", lambda: lookup_speed(args), args.check)
    result["token_lookup"] = _or_error("the token table's lookup routes", lambda: token_lookup(
        torch.device("cpu" if args.check else "cuda"), args.check, args.warmup, args.steps), args.check)
    result["runs"] = run_all(args, started)
    add_ratios(result["runs"])
    result["seconds"] = round(time.perf_counter() - started, 1)
    out = Path(args.out) if args.out else RESULTS / ("gpu_speed_check.json" if args.check else "gpu_speed.json")
    write_result(out, result, markdown(result))


if __name__ == "__main__":
    main()
