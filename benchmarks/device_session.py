"""What a session does with a lent GPU, as one prepared command within a time budget (issue #51's device check).

In order, each step given what is left of ``--budget`` seconds (default 480: 8 minutes of device time):

1. ``make test-gpu``'s tests (``pytest -m gpu``), their log kept;
2. ``make bench-gpu``'s bf16 eager, CUDA-graph and batch-1 rows for every workload (``gpu_speed.py``, cheap rows
   first, whatever does not start within the budget listed as not run);
3. with ``--recipe`` and at least ``--recipe-seconds`` left: ``benchmarks.quality.recipe --preset 60m`` dense vs CoMERA
   (quality at the anchors' width) cut to the steps that fit.

Everything lands in ``benchmarks/results/<device>/`` (``h200`` for an NVIDIA H200) with the date in each name, and is
copied to ``$OUT`` when that is set (the device tool brings ``$OUT`` back). ``--check`` runs the same steps on CPU:
tiny shapes, the GPU tests skipped (there is none), so the script is known to run before device time is spent.

    python -m benchmarks.device_session [--budget 480] [--recipe] [--check] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.probes import RESULTS, ROOT


def device_slug() -> str:
    """``h200`` for "NVIDIA H200", ``cpu-check`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return "cpu-check"
    name = torch.cuda.get_device_name().lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def run_step(name: str, command: list[str], seconds: float, log: Path) -> dict[str, object]:
    """Run ``command`` for at most ``seconds``, its output into ``log``; its name, exit code and wall time."""
    started = time.perf_counter()
    print(f"  {name}: {' '.join(command)} (at most {seconds:.0f} s)", file=sys.stderr, flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled"), "PYTHONUNBUFFERED": "1"}
    with log.open("w") as handle:
        try:
            code = subprocess.run(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=seconds).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return {"step": name, "exit": code, "seconds": round(time.perf_counter() - started, 1), "log": log.name}


def plan(args: argparse.Namespace, out: Path, date: str) -> list[tuple[str, list[str], float]]:
    """(name, command, share of the budget) of each step."""
    python = sys.executable
    speed = [python, "-m", "benchmarks.training.gpu_speed", "--precisions", "bf16-mixed", "--modes", "eager,graphs,batch1",
             "--out", str(out / f"gpu_speed_{date}.json")]
    steps = [("gpu-tests", [python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"], 0.3)] if not args.check else []
    steps.append(("bench-gpu", [*speed, *(["--check", "--models", "llama60m"] if args.check else [])], 0.6 if args.recipe else 1.0))
    if args.recipe:
        recipe = [python, "-m", "benchmarks.quality.recipe",
                  *(["--check"] if args.check else ["--preset", "60m", "--device", "cuda", "--steps", "300"]),
                  "--out", str(out / f"recipe_60m_{date}.json")]
        steps.append(("recipe", recipe, 1.0))
    return steps


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for all the steps")
    parser.add_argument("--recipe", action="store_true", help="then the anchors' recipe, if --recipe-seconds are left")
    parser.add_argument("--recipe-seconds", type=float, default=120.0)
    parser.add_argument("--check", action="store_true", help="on CPU: tiny shapes, no GPU tests")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results/<device>/)")
    args = parser.parse_args(argv)
    date, started = datetime.date.today().isoformat(), time.perf_counter()
    out = Path(args.out) if args.out else RESULTS / device_slug()
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name, command, share in plan(args, out, date):
        left = args.budget - (time.perf_counter() - started)
        if name == "recipe" and left < args.recipe_seconds:
            done.append({"step": name, "exit": "not run", "seconds": 0.0, "log": ""})
            continue
        seconds = max(30.0, share * left)
        if name == "bench-gpu":  # its own budget stops starting runs; the rest of the share finishes one and writes
            command = [*command, "--budget", str(max(10.0, seconds - 60.0))]
        done.append(run_step(name, command, seconds, out / f"{name}_{date}.log"))
    lines = [f"Device session on {device_slug()}, {date}: {args.budget:.0f} s asked", "", "| step | exit | seconds |", "|---|---|---|"]
    lines += [f"| {d['step']} | {d['exit']} | {d['seconds']} |" for d in done]
    (out / f"device_session_{date}.md").write_text("\n".join(lines) + "\n")
    if os.environ.get("OUT"):
        for path in out.glob(f"*{date}*"):
            shutil.copy(path, os.environ["OUT"])
    print("\n".join(lines))
    return done


if __name__ == "__main__":
    main()
