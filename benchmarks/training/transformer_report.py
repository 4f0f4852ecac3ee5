"""``transformer_speed.py``'s results: the ratios, issue 9's bars, the printed tables, the chart, the machine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.probes import GB, machine_basics
from benchmarks.training.transformer_systems import SYSTEMS

BARS = {"dense_over_comera_time_b32": 3.0, "galore_over_comera_time_b1": 2.0, "galore_over_comera_peak_b1": 9.0,
        "galore_over_comera_tensor_peak_b1": 9.0}


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
