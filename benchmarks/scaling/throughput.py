"""Training throughput with 1 and 2 processes, through the CLI as a user runs it, side by side.

For each workload config (``transformer_tiny``: Lightning DDP; ``dlrm_tiny``: our
``torchrec_dmp`` strategy, i.e. TorchRec's DistributedModelParallel) the same ``comera-lightning
fit`` runs as

* ``1p x 1t``: one process, one torch thread;
* ``1p x 2t``: one process, two torch threads (``--threads 2``);
* ``2p x 1t``: two gloo processes of one thread each (``--trainer.devices 2``); for the DLRM
  also ``2p x 1t ddp``, plain DDP with every table replicated, to show what DMP's sharding costs,

each in its own subprocess, the configurations alternated over ``--rounds``. Weak scaling: the
per-process batch stays the config's, so two processes train twice the samples per step.
``ThroughputTimer`` (a Lightning callback added with ``--trainer.callbacks+``) times the training
batches after ``--warmup`` of them and reports samples/s over all ranks; start-up, data set-up
and checkpointing are not timed. ComeraCallback is on (early stage: task loss + rank objective).

    .venv/bin/python -m benchmarks.scaling.throughput [--configs transformer_tiny dlrm_tiny]
        [--batches 60] [--warmup 10] [--rounds 2] [--out benchmarks/results/scaling_throughput.json]

About 5 minutes at the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from benchmarks.probes import ROOT, command_line, machine_basics

# (processes, torch threads per process, strategy for 2 processes) of each measured layout.
LAYOUTS = {
    "transformer_tiny": {"1p x 1t": (1, 1, None), "1p x 2t": (1, 2, None), "2p x 1t": (2, 1, "ddp")},
    "dlrm_tiny": {"1p x 1t": (1, 1, None), "1p x 2t": (1, 2, None), "2p x 1t": (2, 1, "torchrec_dmp"),
                  "2p x 1t ddp": (2, 1, "ddp")},
}


class ThroughputTimer(pl.Callback):
    """Times training batches ``warmup`` … the last; rank 0 writes samples/s over all ranks to ``out``."""

    def __init__(self, out: str, warmup: int = 10) -> None:
        self.out, self.warmup = out, warmup
        self.samples, self.started, self.elapsed = 0, None, 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.started is not None:
            self.samples += _batch_size(batch) * trainer.world_size
            self.elapsed = time.perf_counter() - self.started

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.started is None:
            raise RuntimeError(f"fewer than {self.warmup + 1} training batches ran: raise --batches")
        if trainer.is_global_zero:
            Path(self.out).write_text(json.dumps({"samples": self.samples, "seconds": self.elapsed,
                                                  "world_size": trainer.world_size}))


def _batch_size(batch: Any) -> int:
    """Samples in a batch: its labels' length (a dict's ``labels`` or a ``ClickBatch``'s)."""
    labels = batch["labels"] if isinstance(batch, dict) else batch.labels
    return int(labels.shape[0])


def fit_command(config: str, layout: str, batches: int, warmup: int, out: Path) -> list[str]:
    """The CLI command of one measured run."""
    processes, threads, strategy = LAYOUTS[config][layout]
    timer = {"class_path": "benchmarks.scaling.throughput.ThroughputTimer", "init_args": {"out": str(out), "warmup": warmup}}
    command = [sys.executable, "-m", "comera_lightning", "fit", "--config", config,
               "--threads", str(threads), "--trainer.accelerator", "cpu", "--trainer.devices", str(processes),
               "--trainer.max_epochs", "1", "--trainer.limit_train_batches", str(batches),
               "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
               "--trainer.callbacks+", json.dumps(timer), "--trainer.default_root_dir", str(out.parent)]
    if strategy is not None:
        command += ["--trainer.strategy", strategy]
    return command


def run_once(config: str, layout: str, args: argparse.Namespace, folder: Path) -> float:
    """Samples/s of one run (a subprocess with a time limit, so a stuck collective cannot hang the benchmark)."""
    out = folder / f"{config}-{layout.replace(' ', '')}-{time.monotonic_ns()}.json"
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(fit_command(config, layout, args.batches, args.warmup, out), cwd=folder, env=env,
                          capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{config} {layout} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    measured = json.loads(out.read_text())
    return measured["samples"] / measured["seconds"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--batches", type=int, default=120, help="training batches per process and run")
    parser.add_argument("--warmup", type=int, default=10, help="batches not timed at the start of each run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=300, help="seconds before a run is killed")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.batches <= args.warmup:
        parser.error(f"--batches ({args.batches}) must exceed --warmup ({args.warmup})")
    rates: dict[str, dict[str, list[float]]] = {c: {layout: [] for layout in LAYOUTS[c]} for c in args.configs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for config in args.configs:
                layouts = list(LAYOUTS[config])
                turn = round_index % len(layouts)
                for layout in layouts[turn:] + layouts[:turn]:
                    rate = run_once(config, layout, args, Path(tmp))
                    rates[config][layout].append(rate)
                    print(f"round {round_index}: {config:16s} {layout}: {rate:10,.1f} samples/s", flush=True)
    result = summarise(rates, args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarise(rates: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> dict:
    """Median and range per configuration and layout, and 2 processes over each 1-process layout."""
    workloads = {}
    for config, by_layout in rates.items():
        medians = {layout: statistics.median(values) for layout, values in by_layout.items()}
        two = {layout: medians[layout] for layout in by_layout if layout.startswith("2p")}
        workloads[config] = {
            "strategies_for_2_processes": {layout: LAYOUTS[config][layout][2] for layout in two},
            "samples_per_s": {layout: {"median": round(medians[layout], 1), "range": [round(min(v), 1), round(max(v), 1)]}
                              for layout, v in by_layout.items()},
            "ratios": {f"{two_layout} / {one}": round(rate / medians[one], 2)
                       for two_layout, rate in two.items() for one in ("1p x 1t", "1p x 2t")},
        }
        print(f"{config}: " + ", ".join(f"{k} {v['median']:,.1f}" for k, v in workloads[config]["samples_per_s"].items()))
        print("  " + ", ".join(f"{k}: {v}" for k, v in workloads[config]["ratios"].items()))
    return {"command": command_line(), "machine": machine_basics(), "batches": args.batches, "warmup": args.warmup,
            "rounds": args.rounds, "scaling": "weak (per-process batch fixed)", "workloads": workloads}


if __name__ == "__main__":
    main()
