"""What FSDP would save per process for the paper Transformer, dense and tensorized: the measured reason.

FSDP shards parameters, gradients and optimizer state over N processes (each keeps 1/N); the
activations a step saves for backward are not sharded. So FSDP's saving per process is
``(params + grads + optimizer state) · (1 - 1/N)``, and what matters is that saving as a
fraction of the process's total ``params + grads + state + activations``.

Measured here, float32 on CPU, one process, side by side for the dense and the tensorized
paper classifier (``strategy_speed.build``: d_model 768, 12 heads, d_ff 3072, vocab 30,522,
128 positions; tensorized with linear rank 30 / 3 cores, embedding rank 32 / 4 cores):

* parameter bytes, and gradient bytes after one backward (the sum of ``p.grad.nbytes``);
* optimizer-state bytes after one step, for AdamW and for CAME (every tensor in ``optimizer.state``);
* activation bytes: the storages saved for backward in one training step (forward, the early-stage
  objective ``L + 0.01·R``, backward), caught by ``torch.autograd.graph.saved_tensors_hooks`` and
  counted once per distinct storage; storages that are parameters are left out (counted above).

Rank gates are ordinary parameters here and stepped by the same optimizer (in training
``GateOptimizer``'s Adam holds the same two moments for them). The DLRM is left out: at Criteo
Kaggle cardinalities its dense tables do not fit this host.

    python -m benchmarks.scaling.fsdp_memory [--layers 6] [--batch 32] [--seq 128] [--out benchmarks/results/fsdp_memory.json]
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.probes import machine_basics
from benchmarks.tensor_memory import allocation_peak
from benchmarks.training.strategy_speed import build, make_batch
from comera_lightning import CAME
from comera_lightning.rank import size_surrogate, tt_layers

MIB = 2**20
MAX_POSITIONS = 128
SHARDS = (2, 8)
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0),
    "came": lambda params: CAME(params, lr=1e-4),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options, checked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6, help="encoder layers (the paper: 6; 12 also fits)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128, help=f"tokens per sequence, at most {MAX_POSITIONS}")
    parser.add_argument("--out", default="benchmarks/results/fsdp_memory.json")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.batch < 1:
        parser.error(f"--layers and --batch must be at least 1 (got {args.layers} and {args.batch})")
    if not 2 <= args.seq <= MAX_POSITIONS:
        parser.error(f"--seq must be between 2 and {MAX_POSITIONS}, the model's positions (got {args.seq})")
    return args


def tensor_bytes(tensors) -> int:
    """Sum of ``nbytes`` of the tensors (None skipped)."""
    return sum(t.nbytes for t in tensors if t is not None)


def forward_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The early-stage objective of one step: cross-entropy plus ``0.01·R`` when the model is tensorized."""
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    loss = F.cross_entropy(logits, batch["labels"])
    layers = [m for _, m in tt_layers(model)]
    return loss + 0.01 * size_surrogate(layers) if layers else loss


def saved_activation_bytes(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, int]]:
    """The step's loss (graph alive) and the bytes of the distinct non-parameter storages it saved for backward."""
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, torch.Tensor] = {}  # a reference each, so no storage is freed and its address reused
    skipped: set[int] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in param_storages:
            skipped.add(ptr)
        else:
            saved.setdefault(ptr, tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = forward_loss(model, batch)
    counts = {
        "activation_bytes": sum(t.untyped_storage().nbytes() for t in saved.values()),
        "activation_storages": len(saved),
        "saved_parameter_storages": len(skipped),
    }
    saved.clear()
    return loss, counts


def profiler_forward_bytes(model, batch: dict[str, torch.Tensor]) -> int:
    """Cross-check of the hook count: net bytes the forward allocated and left alive (the graph's saved storages)."""
    holder = {}

    def forward() -> None:
        holder["loss"] = forward_loss(model, batch)

    _, net = allocation_peak(forward)
    holder.clear()
    return net


def batch_split(model, batch: dict[str, torch.Tensor], activation_bytes: int) -> dict[str, float]:
    """Activation bytes split into a part that grows with the batch and a fixed part (a line through batch 1 and B).

    The fixed part is what a step saves whatever the batch: for a TT layer, the partial contractions
    of its cores (weights in all but name, yet made afresh each step and never sharded by FSDP).
    """
    size = len(batch["labels"])
    if size == 1:
        return {}
    loss, one = saved_activation_bytes(model, {k: v[:1] for k, v in batch.items()})
    del loss
    per_sample = (activation_bytes - one["activation_bytes"]) / (size - 1)
    return {"activation_bytes_batch1": one["activation_bytes"], "activation_bytes_per_sample": per_sample,
            "activation_bytes_fixed": one["activation_bytes"] - per_sample}


def measure(layers: int, tensorized: bool, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Parameter, gradient, optimizer-state and activation bytes of one model in one training step."""
    model = build(layers, torch.device("cpu"), tensorized)
    params = [p for p in model.parameters() if p.requires_grad]
    row: dict[str, float] = {"parameters": sum(p.numel() for p in params), "param_bytes": tensor_bytes(params)}
    row["activation_bytes_profiler"] = profiler_forward_bytes(model, batch)
    loss, activations = saved_activation_bytes(model, batch)
    loss.backward()
    del loss
    row["grad_bytes"] = tensor_bytes(p.grad for p in params)
    row.update(activations)
    row.update(batch_split(model, batch, activations["activation_bytes"]))
    for name, make in OPTIMIZERS.items():
        optimizer = make(params)
        optimizer.step()
        row[f"{name}_state_bytes"] = tensor_bytes(
            v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
        del optimizer
    del model, params
    gc.collect()
    return row


def fsdp_savings(row: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per optimizer: the process's total bytes, and what sharding params+grads+state over N saves of it."""
    out = {}
    for name in OPTIMIZERS:
        shardable = row["param_bytes"] + row["grad_bytes"] + row[f"{name}_state_bytes"]
        total = shardable + row["activation_bytes"]
        entry: dict[str, float] = {"shardable_bytes": shardable, "total_bytes": total,
                                   "shardable_fraction": shardable / total}
        for n in SHARDS:
            entry[f"saved_bytes_n{n}"] = shardable * (1 - 1 / n)
            entry[f"saved_fraction_n{n}"] = shardable * (1 - 1 / n) / total
        out[name] = entry
    return out


def host() -> dict[str, object]:
    """Where the figures were taken (no paths)."""
    return {**machine_basics(), "torch": torch.__version__}


def table(result: dict) -> str:
    """The printed summary: bytes per model, then FSDP's saving per optimizer and N."""
    cfg = result["config"]
    lines = [f"Paper Transformer, {cfg['layers']} layers, batch {cfg['batch']} x seq {cfg['seq']}, float32, CPU (MiB)",
             f"{'model':11s} {'params':>9s} {'grads':>9s} {'AdamW st':>9s} {'CAME st':>9s} {'activ.':>9s} {'of which fixed':>14s}"]
    for kind in ("dense", "tensorized"):
        r = result["models"][kind]
        lines.append(f"{kind:11s} " + " ".join(f"{r[k] / MIB:9.1f}" for k in (
            "param_bytes", "grad_bytes", "adamw_state_bytes", "came_state_bytes", "activation_bytes"))
                     + (f" {r['activation_bytes_fixed'] / MIB:14.1f}" if "activation_bytes_fixed" in r else ""))
    lines.append("FSDP saving per process = (params+grads+state)(1-1/N) / (params+grads+state+activations)")
    lines.append(f"{'model':11s} {'optimizer':9s} {'total MiB':>10s} " + " ".join(f"{'N=' + str(n):>14s}" for n in SHARDS))
    for kind in ("dense", "tensorized"):
        for name, s in result["models"][kind]["fsdp"].items():
            cells = " ".join(f"{s[f'saved_bytes_n{n}'] / MIB:7.1f} ({100 * s[f'saved_fraction_n{n}']:4.1f}%)" for n in SHARDS)
            lines.append(f"{kind:11s} {name:9s} {s['total_bytes'] / MIB:10.1f} {cells}")
    lines.append("cross-check, profiler's net bytes after the forward / hook count: " + ", ".join(
        f"{kind} {result['models'][kind]['activation_bytes_profiler'] / result['models'][kind]['activation_bytes']:.4f}"
        for kind in ("dense", "tensorized")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Measure both models, derive FSDP's saving, write the JSON, print the table; returns the result."""
    args = parse_args(argv)
    torch.set_grad_enabled(True)
    batch = make_batch(args.batch, args.seq, torch.device("cpu"))
    result: dict = {"config": {"layers": args.layers, "batch": args.batch, "seq": args.seq, "dtype": "float32",
                               "device": "cpu", "shards": list(SHARDS)}, "host": host(), "models": {}}
    for kind, tensorized in (("dense", False), ("tensorized", True)):
        row = measure(args.layers, tensorized, batch)
        row["fsdp"] = fsdp_savings(row)
        result["models"][kind] = row
    dense, tt = result["models"]["dense"], result["models"]["tensorized"]
    result["tensorized_vs_dense"] = {
        "param_bytes": tt["param_bytes"] / dense["param_bytes"],
        "activation_bytes": tt["activation_bytes"] / dense["activation_bytes"],
        **{f"{name}_saved_fraction_n{n}": {"tensorized": tt["fsdp"][name][f"saved_fraction_n{n}"],
                                             "dense": dense["fsdp"][name][f"saved_fraction_n{n}"]}
           for name in OPTIMIZERS for n in SHARDS},
    }
    print(table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
