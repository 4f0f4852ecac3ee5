"""A trained language model's compression frontier: each path's validation loss at every size it was compressed to,
over the seeds and extra-step budgets of its ``benchmarks.quality.compress`` files."""

from __future__ import annotations

from typing import Any

#: The paths the frontier compares, as the compress files name them.
HEADLINE = {"comera": "CoMERA (the defaults)", "svd_ft": "SVD + fine-tuning at CoMERA's ranks",
            "fwsvd_ft": "Fisher-weighted SVD + fine-tuning at CoMERA's ranks",
            "prune_ft": "magnitude pruning to CoMERA's count + fine-tuning",
            "small": "dense of CoMERA's size from scratch, all the steps"}
FT_LR = 3e-3


def _headline_of(system: str) -> tuple[str, int] | None:
    """(headline path, priority) of a run's system: a rerun from today's trained start (``comera_dense_start``,
    ``<path>_dense_start_ranks``) takes the place of its path's own row."""
    if system == "comera_dense_start":
        return "comera", 1
    base = system.removesuffix("_dense_start_ranks")
    if base != system and base in HEADLINE:
        return base, 1
    return (system, 0) if system in HEADLINE else None


def _headline_runs(result: dict[str, Any]) -> dict[tuple[str, float], float]:
    """(path, compression) → validation loss of one file's headline runs at ``FT_LR`` (``small`` at whatever LR: it
    trains from scratch at the dense model's)."""
    chosen: dict[tuple[str, float], tuple[int, float]] = {}
    for run in result["runs"]:
        headline = _headline_of(run["system"])
        if headline is None or (headline[0] != "small" and abs(run["ft_lr"] - FT_LR) > 1e-12):
            continue
        key, priority = (headline[0], run["compression"]), headline[1]
        if key not in chosen or priority > chosen[key][0]:
            chosen[key] = (priority, run["val_loss"])
    return {key: loss for key, (_, loss) in chosen.items()}


def lm_frontier(results: dict[str, dict[str, Any]]) -> str:
    """One row per (extra steps, path), one column per compression: the mean validation loss over the seeds that
    ran it (their count beside it when fewer than the most), the lowest of each column of a budget in bold."""
    cells: dict[tuple[float, str], dict[float, list[float]]] = {}
    dense = {result["args"]["seed"]: result["dense"]["final_val_loss"] for result in results.values()}
    for result in results.values():
        for (path, compression), loss in _headline_runs(result).items():
            cells.setdefault((result["args"]["extra"], path), {}).setdefault(compression, []).append(loss)
    compressions = sorted({c for row in cells.values() for c in row})
    seeds = max(len(losses) for row in cells.values() for losses in row.values())
    lines = [f"Dense, trained: validation loss {sum(dense.values()) / len(dense):.3f} (the mean over seeds "
             f"{', '.join(map(str, sorted(dense)))}, each its own dense model); every path from those weights at LR "
             f"{FT_LR:g}; each cell the mean over the seeds that ran it (how many in brackets when fewer than {seeds}); "
             "bold: the lowest of its column and budget.", "",
             "| extra steps | path | " + " | ".join(f"{c:g}×" for c in compressions) + " |",
             "|---|---|" + "---|" * len(compressions)]
    for extra in sorted({extra for extra, _ in cells}, reverse=True):
        rows = {path: cells[(extra, path)] for path in HEADLINE if (extra, path) in cells}
        means = {path: {c: sum(v) / len(v) for c, v in row.items()} for path, row in rows.items()}
        ran = list(means.values())
        best = {c: min(m[c] for m in ran if c in m) for c in compressions if any(c in m for m in ran)}
        for path, row in rows.items():
            lines.append(f"| {extra * 100:g} % | {HEADLINE[path]} | "
                         + " | ".join(_cell(means[path].get(c), best.get(c), len(row.get(c, ())), seeds) for c in compressions)
                         + " |")
    return "\n".join(lines)


def _cell(mean: float | None, best: float | None, seeds: int, most: int) -> str:
    """A mean loss, bold when the lowest of its column, with its seed count when fewer than ``most``; "–" if none ran."""
    if mean is None:
        return "–"
    shown = f"**{mean:.3f}**" if mean == best else f"{mean:.3f}"
    return shown + (f" ({seeds})" if seeds < most else "")
