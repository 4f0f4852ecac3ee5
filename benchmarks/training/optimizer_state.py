"""``optimizer_memory.py`` sections (a) and (b): every optimizer's state bytes and step time on one model, interleaved."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from benchmarks.tensor_memory import optimizer_state_bytes
from benchmarks.training.optimizer_models import OPTIMIZERS


def memory_table(model: nn.Module, label: str, timed_steps: int) -> dict[str, object]:
    """State bytes after one step and step times of every optimizer, interleaved step by step.

    All optimizers hold their own state for the same parameters and take turns, so slow phases
    of the machine hit them alike; the weights drift, which does not change the cost of a step.
    The table shows the fastest of the timed steps (the least disturbed by other load); the
    median goes to the JSON too.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    optimizers = {name: make(params) for name, make in OPTIMIZERS.items()}
    for opt in optimizers.values():
        opt.step()  # builds the state
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(timed_steps):
        for name, opt in optimizers.items():
            start = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - start)
    rows = {
        name: {
            "state_bytes": optimizer_state_bytes(opt),
            "step_ms_min": 1e3 * min(times[name]),
            "step_ms_median": 1e3 * statistics.median(times[name]),
        }
        for name, opt in optimizers.items()
    }
    del optimizers
    for p in params:
        p.grad = None

    n_params = sum(p.numel() for p in params)
    base = rows["AdamW"]["state_bytes"]
    print(f"\n{label}: {n_params / 1e6:.2f} M parameters ({4 * n_params / 2**20:.1f} MiB fp32), "
          f"fastest of {timed_steps} steps")
    print(f"{'optimizer':30s} {'state MiB':>10s} {'vs AdamW':>9s} {'step ms':>9s} {'median':>9s}")
    for name, row in rows.items():
        row["state_vs_adamw"] = row["state_bytes"] / base
        mib, ratio = row["state_bytes"] / 2**20, row["state_vs_adamw"]
        print(f"{name:30s} {mib:10.2f} {ratio:9.3f} {row['step_ms_min']:9.1f} {row['step_ms_median']:9.1f}")
    return {"parameters": n_params, "optimizers": rows}
