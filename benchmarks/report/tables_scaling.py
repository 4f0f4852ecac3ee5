"""Renderers of the scaling-out and drop-in results (throughput, readers, FSDP memory, Hugging Face models)."""

from __future__ import annotations

from typing import Any


def _rate(median: float, low: float, high: float) -> str:
    return f"{median:,.0f} ({low:,.0f}–{high:,.0f})"


def rates(result: dict[str, Any]) -> str:
    """Rows/s per system (median and range over rounds): ``criteo_reader`` and ``dmp_pipeline`` results."""
    if "systems" in result:
        rows = {name: (r["rows_per_s_median"], *r["rows_per_s_range"]) for name, r in result["systems"].items()}
    else:
        rows = {name: (r["median"], *r["range"]) for name, r in result["rows_per_s"].items()}
    settings = [f"{result['rows']:,} rows ({result['file_mb']} MB)" if "rows" in result else None,
                f"batch {result['batch']:,}" if "batch" in result else None,
                f"batch {result['batch_per_rank']:,} per rank" if "batch_per_rank" in result else None,
                f"{result['rounds']} rounds" if "rounds" in result else None]
    lines = [", ".join(s for s in settings if s) + ".", "", "| system | rows/s (median, range) |", "|---|---|"]
    lines += [f"| `{name}` | {_rate(*row)} |" for name, row in rows.items()]
    ratios = result.get("ratios") or ({"pipeline_over_plain": result["pipeline_over_plain"]}
                                      if "pipeline_over_plain" in result else {})
    if ratios:
        lines += ["", "Ratios of medians: " + ", ".join(f"`{k}` {v:g}×" for k, v in ratios.items()) + "."]
    return "\n".join(lines)


def throughput(result: dict[str, Any]) -> str:
    """Samples/s per workload and layout (processes × threads), weak scaling, and the ratios."""
    lines = [f"{result['scaling']}; {result['batches']} batches a run after {result['warmup']} warm-up ones, "
             f"{result['rounds']} rounds.", "", "| workload | layout | strategy | samples/s (median, range) |",
             "|---|---|---|---|"]
    for workload, part in result["workloads"].items():
        for layout, rate in part["samples_per_s"].items():
            strategy = part["strategies_for_2_processes"].get(layout, "–")
            lines.append(f"| {workload} | {layout} | {strategy} | {_rate(rate['median'], *rate['range'])} |")
        lines.append(f"| {workload} | ratios | | " + ", ".join(f"{k}: {v:.2f}×" for k, v in part["ratios"].items()) + " |")
    return "\n".join(lines)


def fsdp_memory(result: dict[str, Any]) -> str:
    """``benchmarks.scaling.fsdp_memory``'s own table, as it prints it."""
    from benchmarks.scaling.fsdp_memory import table

    return "```text\n" + table(result).strip() + "\n```"


def drop_in(result: dict[str, Any]) -> str:
    """Random-init Hugging Face classifiers with one plain optimizer: tensorized parameters at the switch and after,
    validation loss against dense."""
    lines = ["| model | optimizer | tensorized parameters at the switch → 150 late steps later | val loss, CoMERA / dense |",
             "|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['model']} | {row['optimizer']} | {row['tt_params_at_switch']:,} → "
                     f"{row['tt_params_after_150']:,} ({100 * row['reduction']:.0f} % fewer) | "
                     f"{row['comera_val_loss_best']:.4f} / {row['dense_val_loss_best']:.4f} |")
    return "\n".join(lines)
