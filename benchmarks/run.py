"""One entry point for the side-by-side benchmarks: ``python -m benchmarks.run --quick|--full``.

Runs each comparison in its own subprocess (so every configuration's peak memory is its own),
in turn, on the same machine in the same run, and writes ``benchmarks/results/summary.json``
(machine, command, wall time of every part) beside each part's own JSON, and a PNG per part
(``plots.py`` draws those the benchmarks do not):

* ``transformer`` — the paper's 6-encoder Transformer, dense vs CoMERA early vs CoMERA pruned, and
  GaLore at batch 1 (``training/transformer_speed.py``);
* ``optimizers`` — CAME vs AdamW vs Adafactor state bytes, step time and whole-training peak
  memory, one process per (model, optimizer) (``training/optimizer_memory.py``);
* ``dlrm`` — dense vs TT embeddings at Criteo Kaggle scale (``training/dlrm_memory.py``);
* ``inference`` — after training: latency, peak memory and file size of the paper's Transformer and
  the Criteo-Kaggle DLRM, dense vs tensorized vs pruned vs exported (``inference/latency.py``);
* ``quality`` — the causal-LM quality race: dense, CoMERA, a narrow dense model and a low-rank model
  of CoMERA's size, GaLore, dense for CoMERA's seconds; validation loss at equal steps and seconds
  (``quality/race.py``; --quick: a tiny Llama, about 1.5 minutes; --full: four models, hours on 2 cores,
  better run as two processes and merged, as its docstring shows);
* ``compression`` — compression per stage with the accuracy/loss reached, for the three
  workloads, through the same code path as ``make demo``.

``--only transformer,dlrm`` runs a subset. ``--quick`` uses fewer steps and the tiny workload
configs (under 10 minutes on 2 cores); ``--full`` the default steps and the scaled-down
comparison configs (16.5 minutes on 2 idle cores, 8.6 for --quick; the wall time is written to the summary).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.plots import draw_all
from benchmarks.probes import RESULTS, ROOT, machine_basics, module_command

#: Each part's module, the stem of its JSON in benchmarks/results/, and its arguments for --quick and --full
#: (the module's defaults are the full run).
SCRIPTS: dict[str, tuple[str, str, list[str], list[str]]] = {
    "transformer": ("benchmarks.training.transformer_speed", "transformer_speed", ["--quick"], []),
    "optimizers": ("benchmarks.training.optimizer_memory", "optimizer_memory", ["--timed-steps", "3", "--steps", "100", "--seeds", "1",
                                                                           "--peak-batch", "2", "--peak-steps", "1"], []),
    "dlrm": ("benchmarks.training.dlrm_memory", "dlrm_memory", ["--dims", "16", "--steps", "2", "--warmup", "1"], []),
    "inference": ("benchmarks.inference.latency", "inference", ["--quick"], []),
    "quality": ("benchmarks.quality", "quality", ["--quick"], []),
}
#: The workload configs of the compression comparison (the same through ``make demo``).
WORKLOADS = {
    "quick": {"transformer": "configs/transformer_tiny.yaml", "dlrm": "configs/dlrm_tiny.yaml", "codebert": "configs/codebert_tiny.yaml"},
    "full": {"transformer": "configs/transformer_tiny.yaml", "dlrm": "configs/dlrm_tiny.yaml", "codebert": "configs/codebert_small.yaml"},
}
PARTS = (*SCRIPTS, "compression")


def machine() -> dict[str, Any]:
    """CPU model, cores, torch version and GPU (if any) of this machine, and the date."""
    import torch

    return {
        **machine_basics(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def run_script(name: str, quick: bool) -> dict[str, Any]:
    """Run one benchmark in a subprocess; its JSON path, exit status and wall time."""
    module, stem, quick_args, full_args = SCRIPTS[name]
    out = RESULTS / f"{stem}{'_quick' if quick else ''}.json"
    command = [*module_command(module), *(quick_args if quick else full_args), "--out", str(out)]
    return _timed(command, {"json": str(out.relative_to(ROOT))})


def run_workload(config: str) -> dict[str, Any]:
    """Run one workload config like ``make demo`` in a subprocess; its per-stage compression and metrics."""
    command = [sys.executable, "-m", "benchmarks.run", "--workload", config]
    result = _timed(command, {})
    if result["returncode"] == 0:
        result.update(json.loads(result.pop("stdout_tail").splitlines()[-1]))
    return result


def _relative(text: str) -> str:
    """``text`` with the checkout's absolute path removed (results must not record where the checkout was)."""
    return text.replace(f"{ROOT}{os.sep}", "")


def _timed(command: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    print(proc.stdout[-3000:], end="", flush=True)
    return {
        "command": " ".join(Path(c).name if i == 0 else os.path.relpath(c, ROOT) if os.path.isabs(c) and c.startswith(str(ROOT)) else c for i, c in enumerate(command)),
        "returncode": proc.returncode, "wall_s": round(wall, 1),
        "stdout_tail": _relative(proc.stdout[-2000:]), "stderr_tail": _relative(proc.stderr[-2000:]) if proc.returncode else "", **extra,
    }


def workload_worker(config: str) -> None:
    """``--workload CONFIG``: fit and test as ``make demo`` does, print one JSON line of per-stage figures."""
    from comera_lightning.cli.demo import run
    from comera_lightning.cli.plot import read_metrics

    summary = run(["--config", config, "--trainer.enable_progress_bar", "false"])
    series = read_metrics(Path(summary["csv_dir"]) / "metrics.csv")
    stages = dict(series.get("comera/stage", []))
    early = [step for step, stage in stages.items() if stage == 0.0]
    at_switch = {}
    for key in ("comera/compression_model", "comera/compression_tt"):
        values = [v for step, v in series.get(key, []) if early and step <= max(early)]
        at_switch[key.split("/")[1]] = values[-1] if values else None
    print(json.dumps({
        "config": config,
        "end_of_early_stage": at_switch,
        "final": {"compression_model": summary["model_compression"], "compression_tt": summary["tt_compression"]},
        "test_metrics": summary["test_metrics"],
        "parameters": {"dense": summary["dense_params"], "final": summary["params"]},
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer steps, tiny workloads (< 10 min on 2 cores)")
    mode.add_argument("--full", action="store_true", help="the scripts' default steps, the comparison configs")
    mode.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts, from {', '.join(PARTS)}")
    args = parser.parse_args()
    if args.workload:
        workload_worker(args.workload)
        return
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}.")
    quick = not args.full
    summary: dict[str, Any] = {"mode": "quick" if quick else "full", "machine": machine(), "parts": {}}
    start = time.perf_counter()
    for part in parts:
        print(f"\n=== {part} ===", flush=True)
        if part == "compression":
            summary["parts"][part] = {name: run_workload(cfg) for name, cfg in WORKLOADS[summary["mode"]].items()}
        else:
            summary["parts"][part] = run_script(part, quick)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    out = RESULTS / f"summary{'_quick' if quick else ''}.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    for png in draw_all(quick):
        print(f"drew {png.relative_to(ROOT)}")
    failed = [p for p, r in summary["parts"].items() if r.get("returncode", 0) or any(isinstance(v, dict) and v.get("returncode") for v in r.values())]
    print(f"\nwrote {out.relative_to(ROOT)} ({summary['wall_s'] / 60:.1f} min){'; FAILED: ' + ', '.join(failed) if failed else ''}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
