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
#: Reruns of a path under a later default, by the tag their rows carry (``comera_<tag>``, ``<path>_<tag>_ranks``): a
#: higher number takes the place of the path's own row and of an earlier rerun, in whichever file of the seed it is.
RERUNS = {"dense_start": 1, "token_steps_4": 2}


def _headline_of(system: str) -> tuple[str, int] | None:
    """(headline path, precedence) of a run's system: 0 for the path's own row, ``RERUNS[tag]`` for a rerun."""
    for tag, precedence in RERUNS.items():
        if system == f"comera_{tag}":
            return "comera", precedence
        base = system.removesuffix(f"_{tag}_ranks")
        if base != system and base in HEADLINE:
            return base, precedence
    return (system, 0) if system in HEADLINE else None


def _headline_runs(results: dict[str, dict[str, Any]]) -> dict[tuple[float, str, float, int], float]:
    """(extra, path, compression, seed) → validation loss of the headline runs at ``FT_LR`` (``small`` at whatever LR: it
    trains from scratch at the dense model's), each the latest rerun found in any of the files."""
    chosen: dict[tuple[float, str, float, int], tuple[int, float]] = {}
    for result in results.values():
        for run in result["runs"]:
            headline = _headline_of(run["system"])
            if headline is None or (headline[0] != "small" and abs(run["ft_lr"] - FT_LR) > 1e-12):
                continue
            key = (result["args"]["extra"], headline[0], run["compression"], result["args"]["seed"])
            if key not in chosen or headline[1] > chosen[key][0]:
                chosen[key] = (headline[1], run["val_loss"])
    return {key: loss for key, (_, loss) in chosen.items()}


def lm_frontier(results: dict[str, dict[str, Any]]) -> str:
    """One row per (extra steps, path), one column per compression: the mean validation loss over the seeds that
    ran it (their count beside it when fewer than the most), the lowest of each column of a budget in bold."""
    cells: dict[tuple[float, str], dict[float, list[float]]] = {}
    dense = {result["args"]["seed"]: result["dense"]["final_val_loss"] for result in results.values()}
    for (extra, path, compression, _), loss in sorted(_headline_runs(results).items()):
        cells.setdefault((extra, path), {}).setdefault(compression, []).append(loss)
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
