"""``optimizer_memory.py`` section (c): whole-training peak memory, one process per (model, optimizer).

``spawn_peak_worker`` starts ``python -m benchmarks.training.optimizer_memory --worker MODEL,OPTIMIZER``,
whose ``run_peak_worker`` builds the model, trains it and prints its measurements.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from benchmarks.probes import module_command, release_free_memory, reset_peak, rss_now, spawn_measured, vm_hwm
from benchmarks.tensor_memory import optimizer_state_bytes, optimizer_state_tensors, tensor_peak
from benchmarks.training.optimizer_models import PAPER_LAYOUT, PEAK_OPTIMIZERS, Encoder

ENTRY = "benchmarks.training.optimizer_memory"  # the module a worker process runs

MIB = 2**20
PEAK_MODELS = ("dense", "tensorized")
PEAK_SEQ = 128
NUM_CLASSES = 3


def build_peak_model(kind: str, args: argparse.Namespace) -> nn.Module:
    """The encoder at the ``--peak-*`` sizes; for ``kind == "tensorized"`` after ``tensorize(**PAPER_LAYOUT)``."""
    torch.manual_seed(0)
    model = Encoder(vocab=args.peak_vocab, d_model=args.peak_d_model, layers=args.peak_layers, max_len=PEAK_SEQ)
    if kind == "tensorized":
        from comera_lightning import tensorize

        tensorize(model, **PAPER_LAYOUT)
    return model


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor) -> float:
    """Forward, cross-entropy, backward, optimizer step, gradients freed; the loss."""
    loss = nn.functional.cross_entropy(model(ids), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def run_peak_worker(kind: str, optimizer_name: str, args: argparse.Namespace) -> dict[str, object]:
    """Build ``kind``, train 1 + ``--peak-steps`` steps with ``optimizer_name``: resident memory and step times."""
    release_free_memory()
    result: dict[str, object] = {"model": kind, "optimizer": optimizer_name, "batch": args.peak_batch,
                                 "rss_import": rss_now()}
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(args.peak_vocab, (args.peak_batch, PEAK_SEQ), generator=gen),
                torch.randint(NUM_CLASSES, (args.peak_batch,), generator=gen)) for _ in range(1 + args.peak_steps)]
    model = build_peak_model(kind, args)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = PEAK_OPTIMIZERS[optimizer_name](params)
    release_free_memory()
    result["peak_build"] = vm_hwm()
    result["rss_built"] = rss_now()
    result["peak_reset"] = reset_peak()
    times, losses = [], []
    for ids, labels in batches:
        start = time.perf_counter()
        losses.append(train_step(model, optimizer, ids, labels))
        times.append(time.perf_counter() - start)
        if len(times) == 1:
            release_free_memory()
            result["rss_model_state"] = rss_now()
    result["peak"] = vm_hwm()
    live = [*params, *optimizer_state_tensors(optimizer), *batches[-1]]
    result.update(tensor_peak(lambda: train_step(model, optimizer, *batches[-1]), live))  # after the RSS peak
    result["optimizer_state_bytes"] = optimizer_state_bytes(optimizer)
    result["parameters"] = sum(p.numel() for p in params)
    result["first_step_ms"] = 1e3 * times[0]
    result["step_ms_all"] = [1e3 * t for t in times[1:]]
    result["step_ms_median"] = statistics.median(result["step_ms_all"])
    result["losses"] = losses
    result["threads"] = torch.get_num_threads()
    return result


def peak_flags(args: argparse.Namespace) -> list[str]:
    """The command-line flags a worker needs to build the same model and train the same steps."""
    names = ("peak_batch", "peak_steps", "peak_vocab", "peak_d_model", "peak_layers")
    return [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in names]


def spawn_peak_worker(kind: str, optimizer_name: str, args: argparse.Namespace) -> dict[str, object]:
    """Run one (model, optimizer) worker in a fresh process: its measurements, or how it failed."""
    command = [*module_command(ENTRY), "--worker", f"{kind},{optimizer_name}", *peak_flags(args)]
    return spawn_measured(command, f"{kind} + {optimizer_name}", {"model": kind, "optimizer": optimizer_name})


def peak_net(row: dict[str, object]) -> int:
    """Training peak minus the resident memory after the imports."""
    return row["peak"] - row["rss_import"]


def peak_ratios(rows: dict[str, dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Peak and peak net of import of every measured optimizer over AdamW's, per model."""
    ratios = {}
    for kind, by_optimizer in rows.items():
        base = by_optimizer.get("AdamW", {})
        if "peak" not in base:
            continue
        for name, row in by_optimizer.items():
            if name != "AdamW" and "peak" in row:
                ratios[f"{kind}/{name}"] = {"peak": row["peak"] / base["peak"], "peak_net": peak_net(row) / peak_net(base),
                                            "tensor_peak": row["tensor_peak"] / base["tensor_peak"]}
    return ratios


def print_peak_table(rows: dict[str, dict[str, dict]], ratios: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    """One row per (model, optimizer) in MiB, then the ratios vs AdamW."""
    print(f"\n(c) whole-training peak memory, one process per (model, optimizer): batch {args.peak_batch} x {PEAK_SEQ} "
          f"tokens, 1 + {args.peak_steps} steps (MiB; peak = VmHWM of training, reset after the build)")
    head = (f"{'model':11s} {'optimizer':10s} {'import':>7s} {'model+state':>11s} {'peak':>7s} {'peak net':>8s} "
            f"{'tensors':>7s} {'build peak':>10s} {'state MiB':>9s} {'step ms':>8s}")
    print(head + "\n" + "-" * len(head))
    for kind, by_optimizer in rows.items():
        for name, row in by_optimizer.items():
            if "peak" not in row:
                print(f"{kind:11s} {name:10s} {row['status']}")
                continue
            print(f"{kind:11s} {name:10s} {row['rss_import'] / MIB:7.0f} {row['rss_model_state'] / MIB:11.0f} "
                  f"{row['peak'] / MIB:7.0f} {peak_net(row) / MIB:8.0f} {row['tensor_peak'] / MIB:7.0f} {row['peak_build'] / MIB:10.0f} "
                  f"{row['optimizer_state_bytes'] / MIB:9.1f} {row['step_ms_median']:8.0f}")
    print("ratios vs AdamW (x; 'net' = minus the import RSS; 'tensors' = peak bytes of live tensors):")
    for key, ratio in ratios.items():
        print(f"  {key:22s} peak {ratio['peak']:5.3f}   peak net {ratio['peak_net']:5.3f}   tensors {ratio['tensor_peak']:5.3f}")


def peak_per_process(args: argparse.Namespace) -> dict[str, object]:
    """Section (c): every (model, optimizer) in its own process, in turn; the rows, ratios and settings."""
    rows = {kind: {name: spawn_peak_worker(kind, name, args) for name in PEAK_OPTIMIZERS} for kind in PEAK_MODELS}
    ratios = peak_ratios(rows)
    print_peak_table(rows, ratios, args)
    settings = {"batch": args.peak_batch, "seq": PEAK_SEQ, "warmup_steps": 1, "timed_steps": args.peak_steps,
                "vocab": args.peak_vocab, "d_model": args.peak_d_model, "layers": args.peak_layers,
                "peak": "VmHWM, reset after the build"}
    return {"settings": settings, "rows": rows, "ratios_vs_adamw": ratios}
