"""Inference after training: latency, peak memory and file size, dense vs tensorized vs pruned vs exported (issue 17).

Systems (``inference_systems.py``): the paper's Transformer ``dense`` / ``comera`` (early stage) /
``comera_pruned`` (comparison 1's simulated late stage) / ``exported`` (the pruned model through
``comera_lightning.export``, loaded from its file), at batch 1 and 32 (128 tokens); the DLRM at
Criteo Kaggle scale ``dense`` / ``comera_pruned`` / ``exported`` at batch 1 and 4,096. Three parts,
in this order:

* **files**, in a subprocess: each model's ``state_dict`` written with ``torch.save`` and the
  exported program with ``torch.export.save``; bytes on disk (the files go to a temporary folder);
* **one process per system** (``--worker``): resident memory after the imports (the exported worker
  imports torch alone), after the build (the exported one: ``torch.export.load``), and the peak
  (``VmHWM``, reset after the build) of the inference calls at every batch size;
* **interleaved** (the headline): all systems of a workload in this process, one call of each in
  turn under ``torch.inference_mode``, order rotated every round; medians of ``--rounds`` after
  ``--warmup``, and the ratios dense / system. The DLRM's exported inputs (``kjt_to_ids``) are
  converted outside the timed call.

Run time on 2 shared cores: about 3 minutes (``--quick``: about 2). One torch thread by default:
with 2 threads on a shared host, rounds stall whenever another process holds a core
(docs/INFERENCE_MEASURED.md, "Threads").

    .venv/bin/python -m benchmarks.inference.latency.latency [--quick] [--workloads transformer,dlrm] [--rounds 7]
        [--warmup 2] [--threads 1] [--out benchmarks/results/inference.json]
    (benchmarks/results/inference.json: ``--threads 1 --rounds 9``)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import (
    RESULTS,
    machine_basics,
    module_command,
    print_result,
    release_free_memory,
    reset_peak,
    rss_now,
    spawn_measured,
    vm_hwm,
    without_out,
)

BATCHES = {"transformer": (1, 32), "dlrm": (1, 4096)}
BARS = {"transformer": {"file_dense_over_exported": 50.0, "latency_b1_dense_over_exported": 2.0}}
MB = 1e6


def build(workload: str, system: str, files: Path) -> Any:
    from benchmarks.inference import systems

    if system == "exported":
        return systems.load_exported(files / f"{workload}_exported.pt2")
    return systems.build_torch_model(workload, system)


def run_files(workload: str, files: Path) -> dict[str, Any]:
    """Write every system's file; their sizes in bytes."""
    import torch

    from benchmarks.inference import systems

    sizes = {}
    for system in systems.SYSTEMS[workload]:
        path = files / (f"{workload}_exported.pt2" if system == "exported" else f"{workload}_{system}_state_dict.pt")
        if system == "exported":
            systems.export_to(workload, path)
        else:
            model = systems.build_torch_model(workload, system)
            torch.save(model.state_dict(), path)
            del model
            release_free_memory()
        sizes[system] = path.stat().st_size
    return {"file_bytes": sizes}


def run_worker(workload: str, system: str, files: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One system alone: memory after imports, after the build, and the peak of its inference calls."""
    import torch

    torch.set_num_threads(args.threads)
    if system != "exported":
        import comera_lightning  # noqa: F401  (the exported program needs torch alone)
    from benchmarks.inference import systems

    release_free_memory()
    result: dict[str, Any] = {"system": system, "rss_import": rss_now()}
    model = build(workload, system, files)
    release_free_memory()
    result.update(rss_built=rss_now(), peak_build=vm_hwm(), peak_reset=reset_peak())
    for batch in BATCHES[workload]:
        inputs = systems.inputs_for(workload, system, batch, args.warmup + 2)
        with torch.inference_mode():
            for one in inputs:
                systems.call(workload, system, model, one)
    result["peak_inference"] = vm_hwm()
    result["imported_comera_lightning"] = "comera_lightning" in sys.modules
    return result


def run_interleaved(workload: str, files: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One call of each system in turn per round, order rotated; medians and dense/system ratios per batch size."""
    import torch

    from benchmarks.inference import systems

    torch.set_num_threads(args.threads)
    names = list(systems.SYSTEMS[workload])
    models = {name: build(workload, name, files) for name in names}
    out: dict[str, Any] = {}
    for batch in BATCHES[workload]:
        print(f"  interleaved: {workload} at batch {batch} ...", file=sys.stderr, flush=True)
        rounds = args.warmup + args.rounds
        inputs = {name: systems.inputs_for(workload, name, batch, rounds) for name in names}
        times: dict[str, list[float]] = {name: [] for name in names}
        with torch.inference_mode():
            for i in range(rounds):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    tick = time.perf_counter()
                    systems.call(workload, name, models[name], inputs[name][i])
                    if i >= args.warmup:
                        times[name].append(1e3 * (time.perf_counter() - tick))
        medians = {name: statistics.median(t) for name, t in times.items()}
        out[str(batch)] = {"ms_median": medians, "ms_all": times,
                           "dense_over": {name: medians["dense"] / medians[name] for name in names if name != "dense"}}
    return out


def spawn(role: str, workload: str, files: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [*module_command(__spec__.name), "--worker", role, "--workload", workload, "--files", str(files),
               f"--threads={args.threads}", f"--warmup={args.warmup}"]
    return spawn_measured(command, f"{workload} {role}", {"system": role})


def summarize(workload: str, result: dict[str, Any]) -> dict[str, Any]:
    """File ratios, and the issue's bars for the Transformer."""
    sizes = result["files"].get("file_bytes", {})
    if "dense" in sizes:
        result["file_dense_over"] = {name: sizes["dense"] / size for name, size in sizes.items() if name != "dense"}
    checks = {}
    for claim, bar in BARS.get(workload, {}).items():
        value = (result.get("file_dense_over", {}).get("exported") if claim.startswith("file")
                 else result["interleaved"]["1"]["dense_over"]["exported"])
        checks[claim] = {"value": value, "bar": bar, "met": value is not None and value >= bar}
    result["claims"] = checks
    return result


def print_table(workload: str, result: dict[str, Any]) -> None:
    sizes = result["files"].get("file_bytes", {})
    workers = {w.get("system"): w for w in result["processes"]}
    print(f"\n{workload}: system | file MB | peak RSS MB (inference) | " + " | ".join(f"ms b{b} (dense/x)" for b in BATCHES[workload]))
    for name in sizes:
        cells = [f"{sizes[name] / MB:9.2f}", f"{workers.get(name, {}).get('peak_inference', 0) / MB:8.0f}"]
        for batch in BATCHES[workload]:
            row = result["interleaved"][str(batch)]
            cells.append(f"{row['ms_median'][name]:9.1f} ({row['dense_over'].get(name, 1.0):.2f}x)")
        print(f"  {name:14s} | " + " | ".join(cells))
    for claim, check in result["claims"].items():
        print(f"  {claim}: {check['value']:.1f} (bar {check['bar']}) {'met' if check['met'] else 'MISSED'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="transformer,dlrm")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: see the module docstring)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up")
    parser.add_argument("--out", default=str(RESULTS / "inference.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 3, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        files = Path(args.files)
        print_result(run_files(args.workload, files) if args.worker == "files" else run_worker(args.workload, args.worker, files, args))
        return
    from benchmarks.inference import systems

    start = time.perf_counter()
    report: dict[str, Any] = {"machine": machine_basics(), "command": " ".join(["benchmarks/inference/latency.py", *without_out(argv)])}
    with tempfile.TemporaryDirectory(prefix="comera_inference_") as folder:
        files = Path(folder)
        for workload in args.workloads.split(","):
            result: dict[str, Any] = {"files": spawn("files", workload, files, args)}
            result["processes"] = [spawn(name, workload, files, args) for name in systems.SYSTEMS[workload]]
            result["interleaved"] = run_interleaved(workload, files, args)
            report[workload] = summarize(workload, result)
            print_table(workload, report[workload])
            release_free_memory()
    import torch

    report["machine"].update(torch=torch.__version__, threads=args.threads, wall_s=round(time.perf_counter() - start, 1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {Path(args.out).name}", file=sys.stderr)


if __name__ == "__main__":
    main()
