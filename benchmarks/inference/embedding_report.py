"""The markdown tables of ``embedding_speed.py``: one per workload, ms and dense/system ratios, bytes."""

from __future__ import annotations

from typing import Any

MB = 1e6


def _time_cell(measure: dict[str, Any] | None, system: str) -> str:
    if not measure or system not in measure["ms_median"]:
        return "–"
    ms = measure["ms_median"][system]
    ratio = measure.get("dense_over_paired", measure.get("dense_over", {})).get(system)
    return f"{ms:.3f}" + (f" ({ratio:.2f}×)" if ratio is not None else "")


def _bytes_cell(sizes: dict[str, int], system: str, with_ratio: bool = True) -> str:
    if system not in sizes:
        return "–"
    value = sizes[system]
    if not isinstance(value, (int, float)):
        return str(value)
    ratio = sizes["dense"] / value if with_ratio and isinstance(sizes.get("dense"), (int, float)) and value else None
    return f"{value / MB:.2f}" + (f" ({ratio:.1f}×)" if ratio is not None and system != "dense" else "")


def workload_table(name: str, result: dict[str, Any], systems: tuple[str, ...]) -> list[str]:
    """Markdown lines: one row per system; times are median ms, ``(dense/x×)`` the ratio to the dense tables."""
    batches = list(result["inference"])
    train_batch = result.get("train_batch")
    header = ["system", *[f"lookup b{b} ms" for b in batches], *[f"DLRM b{b} ms" for b in batches],
              f"train step b{train_batch} ms", "serving MB", "state_dict MB", "export MB", "first call ms"]
    lines = [f"### {name}", "", result["note"] + ".", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system in systems:
        if system in result["unavailable"]:
            lines.append(f"| {system} | " + " | ".join(["–"] * (len(header) - 1)) + " |")
            continue
        cells = [_time_cell(result["inference"][b]["lookup"], system) for b in batches]
        cells += [_time_cell(result["inference"][b]["dlrm"], system) for b in batches]
        cells.append(_time_cell(result.get("train"), system))
        cells.append(_bytes_cell(result["serving_bytes"], system))
        cells.append(_bytes_cell(result.get("state_dict_bytes", {}), system, with_ratio=False))
        cells.append(_bytes_cell(result.get("export_bytes", {}), system))
        first = result["first_call_ms"].get(system)
        cells.append(f"{first:.1f}" if first is not None else "–")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"* {system} unavailable: {why}" for system, why in result["unavailable"].items()]
    return [*lines, ""]


def markdown(report: dict[str, Any], systems: tuple[str, ...]) -> str:
    """The whole report: the host line, then one table per workload."""
    host = report["host"]
    lines = [f"## Embedding speed (issue #28): {host['cpu']}, torch {host['torch']}, {host['threads']} thread(s), "
             f"{host['date']}", "",
             "Median ms per call over interleaved rounds; (N×) = the median over rounds of that round's dense ms / system ms, "
             "or dense bytes / system bytes "
             "(above 1: better than the dense tables). Serving MB: TT `inference_bytes()`, dense and int8 "
             "parameters+buffers, after the timed inference.", ""]
    for name, result in report["workloads"].items():
        lines += workload_table(name, result, systems)
    return "\n".join(lines)
