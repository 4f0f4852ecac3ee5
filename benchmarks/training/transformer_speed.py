"""The paper's 6-encoder Transformer: training-step time and peak memory, dense vs CoMERA vs GaLore.

Issue 9, comparisons 1 and 2 (docs/METHOD.md §3: CoMERA 2-3x faster per epoch than dense training at
batch 32-128; 2x faster and 9x less memory than GaLore at batch 1). The model is
``SentencePairClassifier`` at the paper's size (vocabulary 30,522, d_model 768, 6 post-LN encoders,
12 heads, d_ff 3072, 128 learned positions, dropout 0.1) on synthetic token pairs padded to 128
tokens (static shapes, as ``configs/transformer.yaml`` pads them). Systems:

* ``dense``: the plain model, AdamW (``--optimizer came`` for CAME) on the paper's parameter groups;
* ``comera``: the early stage: tensorized as ``configs/transformer.yaml``'s ``comera:`` section does
  (every candidate layer, linear rank 30 with 3 cores per side, embedding rank 32 with 4 cores, gate
  threshold 1e-2, min_compression 2: 39 layers, the token-type table and the classifier stay
  dense), all gates alive; the loss is cross-entropy + 0.01 · ``size_surrogate`` (the early stage's
  ``L + γR``);
* ``comera_pruned``: the late stage after physical pruning. No real late stage is run (it takes
  GPU-days); its state is simulated: in every bond of every TT layer the gates of all but
  ``round(--keep-fraction · rank)`` indices (default 1/3, at least 1) are set to 0, below the
  threshold, and ``comera_lightning.rank.prune_(model, [optimizer])`` slices them out of the cores,
  the gates and the optimizer. At 1/3 (ranks 30 -> 10, 32 -> 11, 12 -> 4) the tensorized layers go
  from 62.6x to 412x smaller than dense (whole model 61x -> 359x), in line with the paper's 43x ->
  361x from the early to the late stage;
* ``galore`` (batch 1 only, the paper's comparison): the dense model trained with
  ``pytorch_optimizer.GaLore`` (AdamW in a gradient subspace): rank 128, ``update_proj_gap`` 200,
  scale 0.25, ``projection_type`` std on the 2-D weights of the encoder linears (attention
  query/key/value/output, FFN intermediate/output); every other parameter plain AdamW in the same
  optimizer.

One step = forward, loss, backward, optimizer step, gradients freed. Two measurements:

* **interleaved** (the headline): every system of a batch size is built in this process and one
  step of each is timed in turn, rotating the order every round, so that load on the machine hits
  all alike; median of ``--steps`` rounds after ``--warmup``. GaLore recomputes its projectors (one
  SVD per projected matrix) on its first step and every 200 steps; the warm-up hides that, so the
  SVDs of all its matrices are timed separately and reported amortized (``+ svd / 200`` per step);
* **one process per (system, batch)** (``--worker``): resident memory after the imports, after
  the warm-up with the gradients freed (weights + optimizer state), and the peak of training
  (``ru_maxrss``; the high-water mark is reset through ``/proc/self/clear_refs`` once the model is
  built, so the dense model that ``tensorize`` starts from does not count; the peak of the build
  is reported as ``peak_build``, and ``VmHWM`` beside ``ru_maxrss`` as a check). The workers run
  before this process imports torch: Linux starts a child's ``ru_maxrss`` at the high-water mark
  of the process that spawned it. After the timed steps one more step runs under
  ``torch.profiler(profile_memory=True)`` for the **tensor peak**: the bytes of live tensors at
  their highest (``tensor_memory.py``), the CPU counterpart of the ``max_memory_allocated`` a GPU
  comparison such as the paper's reports; the resident set also holds the interpreter and
  libraries (``import torch`` alone is 0.23 GB). Worker step times are reported too, but only the
  interleaved ratios compare like with like.

When a ratio misses issue 9's bar (dense/CoMERA time >= 3 at batch 32; GaLore/CoMERA time >= 2 and
peak >= 9 at batch 1, as resident set and as tensor peak), or with ``--profile``, the CoMERA step is profiled with ``torch.profiler``
(CPU, a few steps, top 10 ops by self CPU time). A PNG bar chart is written next to the JSON.

Run time on 2 idle cores (threads 2): about 7 minutes by default (10 + 2 steps), about 4 with ``--quick``.
``--device cuda`` puts models and batches on the GPU (every step ends with a host sync, so times are
complete) and takes the tensor peak from ``torch.cuda.max_memory_allocated`` (reset after the build);
written for GPU users, it has not been run: no GPU was available where this was developed.

    .venv/bin/python -m benchmarks.training.transformer_speed [--quick] [--layers 6] [--batches 32,1]
        [--steps 10] [--warmup 2] [--threads 2] [--optimizer adamw|came] [--keep-fraction 0.333] [--device cpu|cuda]
        [--out benchmarks/results/transformer_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes import (
    GB,
    command_line,
    machine_basics,
    module_command,
    print_result,
    release_free_memory,
    reset_peak,
    rss_now,
    rss_peak,
    spawn_measured,
    vm_hwm,
)
from benchmarks.tensor_memory import optimizer_state_bytes, optimizer_state_tensors, tensor_peak

SYSTEMS = ("dense", "galore", "comera", "comera_pruned")
GALORE_BATCH = 1  # GaLore is compared where the paper compares it
GALORE = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "projection_type": "std"}
GALORE_TARGETS = ("attention.query", "attention.key", "attention.value", "attention.output", "ffn.intermediate", "ffn.output")
# configs/transformer.yaml's comera: section, as ComeraCallback passes it to tensorize().
TENSORIZE = {"max_rank": 30, "embedding_max_rank": 32, "num_cores": 3, "embedding_num_cores": 4,
             "gate_threshold": 1e-2, "min_compression": 2.0, "init": "random", "include_attention": True, "include_embeddings": True}
LEARNING_RATES = {"lr_cores": 1e-4, "lr_gates": 1e-3, "lr_other": 5e-5}  # the paper's (docs/METHOD.md §2)
RANK_WEIGHT = 0.01  # γ of the early stage's L + γR
NUM_CLASSES = 3
BARS = {"dense_over_comera_time_b32": 3.0, "galore_over_comera_time_b1": 2.0, "galore_over_comera_peak_b1": 9.0,
        "galore_over_comera_tensor_peak_b1": 9.0}
QUICK = {"steps": 3, "warmup": 1}


# ---- building the systems -----------------------------------------------------------------------


def build_model(args: argparse.Namespace) -> Any:
    """The paper's SentencePairClassifier at the sizes in ``args``, seeded (the same weights every time)."""
    import torch

    from comera_lightning.models.transformer import SentencePairClassifier

    torch.manual_seed(args.seed)
    return SentencePairClassifier(
        vocab_size=args.vocab, d_model=args.d_model, num_layers=args.layers, num_heads=args.heads,
        d_ff=args.d_ff, max_positions=args.seq, num_classes=NUM_CLASSES,
    )


def keep_ranks_(model: Any, keep_fraction: float) -> None:
    """Simulate a late-stage state: in every bond keep ``round(keep_fraction · rank)`` gates, zero the rest."""
    import torch

    from comera_lightning.rank import tt_layers

    with torch.no_grad():
        for _, layer in tt_layers(model):
            for gate in layer.gates:
                keep = max(1, round(keep_fraction * gate.numel()))
                gate[keep:] = 0.0


def make_optimizer(system: str, model: Any, args: argparse.Namespace) -> Any:
    """GaLore for ``galore``; otherwise AdamW (or CAME) on the paper's cores/gates/other groups."""
    import torch

    from comera_lightning import CAME
    from comera_lightning.optim.param_groups import comera_param_groups

    if system == "galore":
        from pytorch_optimizer import GaLore

        projected = [p for n, p in model.named_parameters()
                     if p.dim() == 2 and ".encoder." in n and n.removesuffix(".weight").endswith(GALORE_TARGETS)]
        chosen = {id(p) for p in projected}
        others = [p for p in model.parameters() if id(p) not in chosen]
        return GaLore([{"params": others}, {"params": projected, **GALORE}], lr=LEARNING_RATES["lr_other"], weight_decay=0.0)
    groups = comera_param_groups(model, **LEARNING_RATES)
    if args.optimizer == "came":
        return CAME(groups, lr=LEARNING_RATES["lr_other"])
    return torch.optim.AdamW(groups, weight_decay=0.0)


class System:
    """One trainable system: model, optimizer and (for CoMERA) its TT layers and surrogate normaliser."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        from comera_lightning import tensorize
        from comera_lightning.rank import prune_, surrogate_normalizer, tt_layers

        self.name = name
        self.model = build_model(args)
        self.layers: list[Any] = []
        self.normalizer = 0.0
        if name.startswith("comera"):
            tensorize(self.model, **TENSORIZE)
            self.layers = [m for _, m in tt_layers(self.model)]
            self.normalizer = surrogate_normalizer(self.layers)  # fixed at the start, as the callback does
        self.model.to(args.device)
        self.optimizer = make_optimizer(name, self.model, args)
        if name == "comera_pruned":
            keep_ranks_(self.model, args.keep_fraction)
            prune_(self.model, [self.optimizer])
        self.model.train()

    def step(self, batch: dict[str, Any]) -> float:
        """Forward, cross-entropy (+ γ·size surrogate for CoMERA), backward, optimizer step; returns the loss."""
        import torch.nn.functional as F

        from comera_lightning.rank import size_surrogate

        logits = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = F.cross_entropy(logits, batch["labels"])
        if self.layers:
            loss = loss + RANK_WEIGHT * size_surrogate(self.layers, "mean", self.normalizer)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def describe(self) -> dict[str, Any]:
        """Parameter counts, compression of the tensorized layers and their physical ranks."""
        from comera_lightning.rank import compression_stats, tt_layers

        stats = compression_stats(self.model)
        out: dict[str, Any] = {"params_model": stats.model_parameters, "params_dense_model": stats.dense_model_parameters}
        if self.layers:
            out.update(params_tt=stats.tt_parameters, params_tt_dense=stats.dense_tt_parameters,
                       tt_compression=stats.tt_compression, model_compression=stats.model_compression,
                       ranks={n: list(m.physical_ranks) for n, m in tt_layers(self.model)})
        return out


def make_batches(batch_size: int, count: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``count`` synthetic sentence-pair batches: random ids, full 128-token masks, two segments."""
    import torch

    generator = torch.Generator().manual_seed(args.seed + batch_size)
    types = torch.zeros(batch_size, args.seq, dtype=torch.long)
    types[:, args.seq // 2:] = 1
    batches = [{
        "input_ids": torch.randint(0, args.vocab, (batch_size, args.seq), generator=generator),
        "attention_mask": torch.ones(batch_size, args.seq, dtype=torch.long),
        "token_type_ids": types,
        "labels": torch.randint(0, NUM_CLASSES, (batch_size,), generator=generator),
    } for _ in range(count)]
    return [{key: value.to(args.device) for key, value in batch.items()} for batch in batches]


def systems_for(batch_size: int) -> list[str]:
    """The systems compared at ``batch_size`` (GaLore only at batch 1)."""
    return [s for s in SYSTEMS if s != "galore" or batch_size == GALORE_BATCH]


# ---- one system in its own process: memory ------------------------------------------------------


def run_worker(system: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build ``system``, train ``warmup + steps`` steps at ``batch_size``, return memory and times."""
    import torch

    torch.set_num_threads(args.threads)
    import comera_lightning  # noqa: F401  (so that the import baseline includes it)

    if system == "galore":
        import pytorch_optimizer  # noqa: F401

    release_free_memory()
    result: dict[str, Any] = {"system": system, "batch": batch_size, "rss_import": rss_now()}
    batches = make_batches(batch_size, args.warmup + args.steps, args)
    start = time.perf_counter()
    trained = System(system, args)
    result["build_s"] = time.perf_counter() - start
    release_free_memory()
    result["peak_build"] = rss_peak()
    result["rss_built"] = rss_now()
    result["peak_reset"] = reset_peak()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i, batch in enumerate(batches):
        tick = time.perf_counter()
        losses.append(trained.step(batch))
        if i >= args.warmup:
            times.append(time.perf_counter() - tick)
        if i == args.warmup - 1:
            release_free_memory()
            result["rss_model_state"] = rss_now()
    result["peak"] = rss_peak()
    result["vm_hwm"] = vm_hwm()
    if args.device == "cuda":  # the allocator's own statistics, as the paper measures
        result.update(tensor_bytes_before=torch.cuda.memory_allocated(), tensor_peak=torch.cuda.max_memory_allocated())
    else:
        live = [*trained.model.parameters(), *optimizer_state_tensors(trained.optimizer), *batches[-1].values()]
        result.update(tensor_peak(lambda: trained.step(batches[-1]), live))  # after the RSS peak: the profiler costs memory
    result["step_ms_median"] = 1e3 * statistics.median(times)
    result["step_ms_all"] = [1e3 * t for t in times]
    result["losses"] = losses
    result["optimizer_state_bytes"] = optimizer_state_bytes(trained.optimizer)
    result["params_model"] = trained.describe()["params_model"]
    result["torch"] = torch.__version__
    result["threads"] = torch.get_num_threads()
    return result


def spawn_worker(system: str, batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker subprocess: its measurements, or how it failed."""
    command = [*module_command(__spec__.name), "--worker", system, "--worker-batch", str(batch_size),
               *model_flags(args)]
    return spawn_measured(command, f"{system} at batch {batch_size}", {"system": system, "batch": batch_size})


def model_flags(args: argparse.Namespace) -> list[str]:
    """The command-line flags a worker needs to rebuild the same systems and steps."""
    names = ("layers", "d_model", "d_ff", "heads", "vocab", "seq", "steps", "warmup", "threads", "optimizer",
             "keep_fraction", "seed", "device")
    return [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in names]


# ---- all systems of one batch size in this process: time ----------------------------------------


def run_interleaved(batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Time one step of each system in turn (order rotated every round); medians after the warm-up."""
    names = systems_for(batch_size)
    print(f"  interleaved: {', '.join(names)} at batch {batch_size} ...", file=sys.stderr, flush=True)
    systems = {name: System(name, args) for name in names}
    batches = make_batches(batch_size, args.warmup + args.steps, args)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i, batch in enumerate(batches):
        for name in names[i % len(names):] + names[:i % len(names)]:
            tick = time.perf_counter()
            systems[name].step(batch)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - tick)
    out: dict[str, Any] = {name: {"step_ms_median": 1e3 * statistics.median(t), "step_ms_all": [1e3 * x for x in t],
                                  **systems[name].describe()} for name, t in times.items()}
    if "galore" in systems:
        svd_ms = galore_refresh_ms(systems["galore"])
        out["galore"].update(svd_refresh_ms=svd_ms,
                             step_ms_amortized=out["galore"]["step_ms_median"] + svd_ms / GALORE["update_proj_gap"])
    return out


def galore_refresh_ms(system: System) -> float:
    """Milliseconds of one projector refresh of ``system``'s GaLore: a thin SVD of every projected matrix."""
    import torch

    matrices = [torch.randn_like(p) for group in system.optimizer.param_groups if "rank" in group
                for p in group["params"] if p.dim() == 2]
    start = time.perf_counter()
    for matrix in matrices:
        torch.linalg.svd(matrix, full_matrices=False)
    if matrices and matrices[0].is_cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start)


# ---- profile, ratios, claims, output ------------------------------------------------------------


def profile_step(system: str, batch_size: int, args: argparse.Namespace, steps: int = 3) -> dict[str, Any]:
    """Top 10 ops by self CPU time over ``steps`` steps of ``system`` (after one unprofiled step)."""
    from torch.profiler import ProfilerActivity, profile

    trained = System(system, args)
    batches = make_batches(batch_size, steps + 1, args)
    trained.step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[1:]:
            trained.step(batch)
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in averages)
    top = [{"op": e.key, "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "self_cpu_share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in averages[:10]]
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    return {"system": system, "batch": batch_size, "steps": steps, "top10": top, "table": table}


def ratios(interleaved: dict[int, Any], processes: dict[int, Any]) -> dict[str, float]:
    """Dense/CoMERA and GaLore/CoMERA ratios of step time (interleaved) and peak memory (own process)."""
    out: dict[str, float] = {}
    for batch, rows in interleaved.items():
        bases = {"dense": rows["dense"]["step_ms_median"]}
        if "galore" in rows:
            bases.update(galore=rows["galore"]["step_ms_median"], galore_amortized=rows["galore"]["step_ms_amortized"])
        for tt in ("comera", "comera_pruned"):
            for base, ms in bases.items():
                out[f"{base}_over_{tt}_time_b{batch}"] = ms / rows[tt]["step_ms_median"]
    for batch, rows in processes.items():
        for base in ("dense", "galore"):
            for tt in ("comera", "comera_pruned"):
                if "peak" in rows.get(base, {}) and "peak" in rows.get(tt, {}):
                    b, t = rows[base], rows[tt]
                    out[f"{base}_over_{tt}_peak_b{batch}"] = b["peak"] / t["peak"]
                    net = (b["peak"] - b["rss_import"]) / (t["peak"] - t["rss_import"])
                    out[f"{base}_over_{tt}_peak_net_b{batch}"] = net
                    out[f"{base}_over_{tt}_tensor_peak_b{batch}"] = b["tensor_peak"] / t["tensor_peak"]
    return out


def check_claims(ratio: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Issue 9's bars, for the early-stage and the pruned CoMERA (a missing ratio is left out)."""
    claims = {}
    for key, bar in BARS.items():
        for stage in ("comera", "comera_pruned"):
            name = key.replace("comera", stage)
            if name in ratio:
                claims[name] = {"bar": bar, "measured": round(ratio[name], 3), "met": ratio[name] >= bar}
    return claims


def print_tables(interleaved: dict[int, Any], processes: dict[int, Any], ratio: dict[str, float],
                 claims: dict[str, Any], args: argparse.Namespace) -> None:
    """Interleaved step times, per-process memory, the ratios and the bars."""
    print(f"\nTransformer training step ({args.layers} encoders, d_model {args.d_model}, d_ff {args.d_ff}, "
          f"{args.seq} tokens, {args.optimizer} for dense/CoMERA, {args.threads} threads)")
    print(f"\nstep time, interleaved in one process (median ms of {args.steps} steps after {args.warmup} warm-up):")
    head = f"{'batch':>5s} " + " ".join(f"{s:>14s}" for s in SYSTEMS) + f" {'galore+svd/200':>15s}"
    print(head + "\n" + "-" * len(head))
    for batch, rows in interleaved.items():
        cells = " ".join(f"{rows[s]['step_ms_median']:14.1f}" if s in rows else f"{'-':>14s}" for s in SYSTEMS)
        amortized = f"{rows['galore']['step_ms_amortized']:15.1f}" if "galore" in rows else f"{'-':>15s}"
        print(f"{batch:5d} {cells} {amortized}")
    if processes:
        print("\npeak resident memory, one process per (system, batch) (GB; ru_maxrss of training, reset after the build):")
        head = (f"{'batch':>5s} {'system':14s} {'import':>7s} {'model+state':>11s} {'peak':>7s} {'VmHWM':>7s} "
                f"{'peak net':>8s} {'tensors':>7s} {'peak build':>10s} {'opt state MB':>12s} {'step ms':>8s}")
        print(head + "\n" + "-" * len(head))
    for batch, rows in processes.items():
        for name, row in rows.items():
            if "peak" not in row:
                print(f"{batch:5d} {name:14s} {row['status']}")
                continue
            print(f"{batch:5d} {name:14s} {row['rss_import'] / GB:7.2f} {row['rss_model_state'] / GB:11.2f} "
                  f"{row['peak'] / GB:7.2f} {row['vm_hwm'] / GB:7.2f} {(row['peak'] - row['rss_import']) / GB:8.2f} "
                  f"{row['tensor_peak'] / GB:7.3f} {row['peak_build'] / GB:10.2f} "
                  f"{row['optimizer_state_bytes'] / 1e6:12.1f} {row['step_ms_median']:8.1f}")
    print("\nratios (x; time from the interleaved run, peak from the own-process runs, 'net' = minus import RSS,\n"
          "'tensor_peak' = peak bytes of live tensors, what max_memory_allocated reports on a GPU):")
    for key, value in ratio.items():
        print(f"  {key:44s} {value:8.2f}")
    print("\nissue 9 bars:")
    for key, claim in claims.items():
        print(f"  {key:44s} {claim['measured']:8.2f} >= {claim['bar']:.0f}: {'met' if claim['met'] else 'NOT met'}")


def plot(interleaved: dict[int, Any], processes: dict[int, Any], args: argparse.Namespace, path: Path) -> Path:
    """Bar chart: interleaved step time, own-process peak RSS and tensor peak per system, one group per batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"dense": "tab:gray", "galore": "tab:orange", "comera": "tab:blue", "comera_pruned": "tab:green"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = ((interleaved, "step_ms_median", 1.0, "{:.0f}", "step time (ms, interleaved)"),
              (processes, "peak", 1.0 / GB, "{:.2f}", "peak resident memory (GB, own process)"),
              (processes, "tensor_peak", 1.0 / GB, "{:.3f}", "peak of live tensors (GB, own process)"))
    for ax, (data, key, scale, fmt, title) in zip(axes, panels):
        centres = []
        for g, (batch, rows) in enumerate(data.items()):
            names = [s for s in SYSTEMS if key in rows.get(s, {})]
            for i, name in enumerate(names):
                value = rows[name][key] * scale
                x = g * (len(SYSTEMS) + 1) + i
                ax.bar(x, value, color=colors[name], label=name)
                ax.text(x, value, fmt.format(value), ha="center", va="bottom", fontsize=7)
            centres.append(g * (len(SYSTEMS) + 1) + (len(names) - 1) / 2)
        ax.set_xticks(centres, [f"batch {b}" for b in data])
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
        ax.legend([handles[s] for s in SYSTEMS if s in handles], [s for s in SYSTEMS if s in handles], fontsize=8)
    fig.suptitle(f"{args.layers}-encoder Transformer training step: dense vs GaLore vs CoMERA ({args.device})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def machine(args: argparse.Namespace) -> dict[str, Any]:
    """CPU model, cores, RAM, torch version, threads, load, and the GPU when the run used one."""
    import torch

    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    return {**machine_basics(), "torch": torch.__version__, "threads": args.threads, "device": args.device, "gpu": gpu}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--worker*`` are internal); ``--quick`` lowers the step counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"a few minutes: {QUICK}")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--d-ff", type=int, default=3072)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batches", default="32,1", help="comma-separated batch sizes (GaLore runs at batch 1)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--optimizer", choices=("adamw", "came"), default="adamw", help="for dense and CoMERA")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: models and batches on the GPU, memory from torch.cuda.max_memory_allocated")
    parser.add_argument("--keep-fraction", type=float, default=1 / 3, help="ranks kept per bond in comera_pruned")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="profile the CoMERA step even when every bar is met")
    parser.add_argument("--no-processes", action="store_true", help="skip the per-process memory runs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/transformer_speed.json"))
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = QUICK["steps"], QUICK["warmup"]
    if args.warmup < 1 or args.steps < 1:
        parser.error(f"--warmup and --steps must be at least 1, got {args.warmup} and {args.steps}.")
    if not 0 < args.keep_fraction <= 1:
        parser.error(f"--keep-fraction must be in (0, 1], got {args.keep_fraction}.")
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    return args


def main(argv: list[str] | None = None) -> None:
    """Interleaved timing per batch size, one process per (system, batch), profile if short; print and save."""
    args = parse_args(argv)
    if args.worker:
        print_result(run_worker(args.worker, args.worker_batch, args))
        return
    if args.device == "cuda":  # checked up front (imports torch here: on a GPU run the GPU figures are the ones to read)
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device here; run without --device (CPU) or on a GPU machine.")
    start = time.perf_counter()
    # Workers first, while this process is small: a child's ru_maxrss starts at its parent's peak.
    processes = {} if args.no_processes else {b: {s: spawn_worker(s, b, args) for s in systems_for(b)} for b in args.batches}
    import torch

    torch.set_num_threads(args.threads)
    interleaved = {}
    for batch in args.batches:
        interleaved[batch] = run_interleaved(batch, args)
        release_free_memory()
    ratio = ratios(interleaved, processes)
    claims = check_claims(ratio)
    missed = {int(k.rsplit("_b", 1)[1]) for k, c in claims.items() if not c["met"]}
    profiles = [profile_step("comera", b, args) for b in args.batches if b in missed or args.profile]
    print_tables(interleaved, processes, ratio, claims, args)
    for prof in profiles:
        print(f"\ntorch.profiler, comera step at batch {prof['batch']} ({prof['steps']} steps, top 10 by self CPU):\n"
              f"{prof['table']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = plot(interleaved, processes, args, args.out.with_suffix(".png"))
    payload = {
        "benchmark": "transformer_speed",
        "command": command_line(),
        "wall_s": time.perf_counter() - start,
        "machine": machine(args),
        "settings": {**{k: v for k, v in vars(args).items() if not k.startswith("worker") and k != "out"},
                     "tensorize": TENSORIZE, "learning_rates": LEARNING_RATES, "rank_weight": RANK_WEIGHT,
                     "galore": GALORE, "galore_targets": GALORE_TARGETS},
        "interleaved": {str(b): rows for b, rows in interleaved.items()},
        "processes": {str(b): rows for b, rows in processes.items()},
        "ratios": ratio,
        "claims": claims,
        "profiles": profiles,
        "png": str(png),
    }
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {args.out} and {png} in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
