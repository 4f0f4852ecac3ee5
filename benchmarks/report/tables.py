"""Markdown renderers for result files whose benchmark has none of its own (each takes the loaded JSON)."""

from __future__ import annotations

import re
from typing import Any

MB = 1e6
GB = 1e9


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def transformer_speed(result: dict[str, Any]) -> str:
    """Step time per batch and system (dense / system beside it), then the paper's bars as measured."""
    lines = ["| batch | system | step ms (median) | dense / system | tensor peak MB | resident peak MB |",
             "|---|---|---|---|---|---|"]
    for batch, systems in result["interleaved"].items():
        dense_ms = systems["dense"]["step_ms_median"]
        for name, timing in systems.items():
            process = result["processes"][batch].get(name, {})
            peak = process.get("tensor_peak")
            rss = process.get("peak")
            lines.append(f"| {batch} | {name} | {timing['step_ms_median']:,.1f} | {_ratio(dense_ms / timing['step_ms_median'])}"
                         f" | {'–' if peak is None else f'{peak / MB:,.1f}'} | {'–' if rss is None else f'{rss / MB:,.0f}'} |")
    lines += ["", "| bar (the paper's claim) | needed | measured | met |", "|---|---|---|---|"]
    for name, claim in result.get("claims", {}).items():
        lines.append(f"| `{name}` | {claim['bar']:g}× | {claim['measured']:.2f}× | {'yes' if claim['met'] else 'no'} |")
    return "\n".join(lines)


def dlrm_memory(result: dict[str, Any]) -> str:
    """Per embedding dimension: table parameters, a step's peak memory and time, dense / TT ratios."""
    lines = [f"Criteo's 26 tables, batch {result['settings']['batch']:,}, {result['settings']['optimizer']} "
             f"(dense: fused; TT: the package's), max rank {result['settings']['max_rank']}.", "",
             "| dim | system | table parameters | peak memory GB | step ms | status |", "|---|---|---|---|---|---|"]
    for dim, systems in result["results"].items():
        for name, row in systems.items():
            step = row.get("step_ms_median")
            lines.append(f"| {dim} | {name} | {row['params_embedding']:,} | {row['peak'] / GB:.2f} | "
                         f"{'–' if step is None else f'{step:,.0f}'} | {row.get('status', 'measured')} |")
    lines += ["", "| dim | tables smaller | peak memory lower | step faster |", "|---|---|---|---|"]
    for dim, ratio in result["ratios"].items():
        lines.append(f"| {dim} | {ratio['embedding_compression']:.1f}× | {ratio['peak_rss']:.1f}× | "
                     f"{_ratio(ratio.get('step_time'))} |")
    return "\n".join(lines) + "\n\nA `computed` dense row did not fit this host: its peak is predicted, not measured."


def inference(result: dict[str, Any]) -> str:
    """Per workload: file size and batch latency of each system, dense / system beside them."""
    lines = []
    for workload in ("transformer", "dlrm"):
        part = result[workload]
        files = part["files"]["file_bytes"]
        batches = list(part["interleaved"])
        lines += [f"**{workload}**", "", "| system | file MB | " + " | ".join(f"batch {b} ms" for b in batches) + " |",
                  "|---|---|" + "---|" * len(batches)]
        for name in files:
            cells = []
            for batch in batches:
                timing = part["interleaved"][batch]
                ms = timing["ms_median"].get(name)
                over = 1.0 if name == "dense" else timing["dense_over"].get(name)
                cells.append("–" if ms is None else f"{ms:,.2f} ({_ratio(over)})")
            lines.append(f"| {name} | {files[name] / MB:,.2f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "(×: dense's time over the system's, interleaved rounds in one process.)"


def stored_markdown(result: dict[str, Any]) -> str:
    """The tables the benchmark wrote into its JSON (``markdown``) when it ran, its title dropped (the section's
    heading stands for it)."""
    lines = result["markdown"].strip().splitlines()
    return "\n".join(lines[1:] if lines and lines[0].startswith("## ") else lines).strip()


def _best_marked(values: dict[float, float]) -> dict[float, str]:
    best = min(values.values())
    return {lr: (f"**{v:.3f}**" if v == best else f"{v:.3f}") for lr, v in values.items()}


def _served_rows(dense: dict[str, Any] | None, runs: list[dict[str, Any]], source: str = "") -> list[str]:
    """The exported programs of the runs that were served (``--served``): file MB, batch-1 and batch-32 ms, beside
    ``dense``'s (its ``served``); ``source``: the file named in the heading."""
    runs = [r for r in runs if "served" in r]
    if not runs:
        return []
    lines = ["", f"**Served**{f' (`{source}`)' if source else ''}: each exported program loaded back and timed on CPU in one process "
             "(median ms per call; × is dense's time over the system's)", "",
             "| system | compression | LR | file MB | batch-1 ms | batch-32 ms |", "|---|---|---|---|---|---|"]
    if dense:
        lines.append(f"| dense | – | – | {dense['file_bytes'] / MB:.2f} | {dense['ms_batch1']:.2f} | {dense['ms_batch32']:.2f} |")
    for r in runs:
        cells = [f"{r['served'][k]:.2f}" + (f" ({dense[k] / r['served'][k]:.2f}×)" if dense else "") for k in ("ms_batch1", "ms_batch32")]
        lr = f"{r['ft_lr']:g}" if "ft_lr" in r else "–"
        lines.append(f"| {r['system']} | {r['compression']:g}× | {lr} | {r['served']['file_bytes'] / MB:.2f} | "
                     + " | ".join(cells) + " |")
    return lines


def compress_runs(result: dict[str, Any]) -> str:
    """A trained model compressed: final validation loss per system and fine-tuning LR, per compression; each
    system's best LR in bold (``runs`` of ``benchmarks.quality.compress``, gathered into one file)."""
    lrs = sorted({run["ft_lr"] for run in result["runs"]})
    dense_ft = result.get("dense_ft", {})
    lines = [f"Dense {result['dense']['model']}, trained {result['dense']['steps']:,} steps: validation loss "
             f"**{result['dense']['final_val_loss']:.3f}**, {result['dense']['parameters']:,} parameters"
             + (f"; trained {dense_ft['steps']} steps more at {dense_ft['lr']:g}: {dense_ft['final_val_loss']:.3f}"
                if dense_ft else "") + "."]
    for compression in sorted({run["compression"] for run in result["runs"]}):
        lines += ["", f"**{compression:g}× smaller tensorized layers** (validation loss at each fine-tuning LR)", "",
                  "| system | parameters | " + " | ".join(f"{lr:g}" for lr in lrs) + " |",
                  "|---|---|" + "---|" * len(lrs)]
        for system in result["systems"]:
            same = [r for r in result["runs"] if r["system"] == system and r["compression"] == compression]
            runs = {r["ft_lr"]: r for r in same}
            if len(runs) < len(same):
                raise ValueError(f"{system} at {compression:g}x has two runs at one LR: give one another name")
            if not runs:
                continue
            cells = _best_marked({lr: r["val_loss"] for lr, r in runs.items()})
            params = min(r["parameters"] for r in runs.values())
            lines.append(f"| {system} | {params:,} | " + " | ".join(cells.get(lr, "–") for lr in lrs) + " |")
    lines += _served_rows(result["dense"].get("served"), result["runs"])
    lines += ["", "Systems:"] + [f"* `{name}`: {what}" for name, what in result["systems"].items()]
    note = result.get("note")
    return "\n".join(lines) + (f"\n\n{note}." if note else "")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def pairs_by_seed(results: dict[str, dict[str, Any]]) -> str:
    """Compressing a trained classifier (``compress_pairs`` files by name): each (file, system) row the mean over the
    seeds' files (``<stem>_seed<N>.json`` beside ``<stem>.json``; a file set with seeds beyond the full runs' also
    shows its own dense models), test accuracy and validation loss per compression."""
    return _by_seed(results, (("test_acc", "accuracy"), ("val_loss", "val loss")), "validation loss")


def dlrm_by_seed(results: dict[str, dict[str, Any]]) -> str:
    """``pairs_by_seed`` for ``compress_dlrm`` files: test AUC, test loss and the compressed tables' parameters."""
    return _by_seed(results, (("test_auc", "AUC"), ("test_loss", "loss"), ("table_parameters", "tables")), "test loss")


def _by_seed(results: dict[str, dict[str, Any]], metrics: tuple[tuple[str, str], ...], second: str) -> str:
    groups: dict[str, list[dict[str, Any]]] = {}
    for source, result in results.items():
        groups.setdefault(re.sub(r"_seed\d+$", "", source.removesuffix(".json")), []).append(result)
    runs = list(results.values())
    full = ({r["args"]["seed"]: r for r in runs if "--systems" not in r["command"]}  # one per seed: its dense model
            or {r["args"]["seed"]: r for r in runs})
    dense = [r["dense"] for r in full.values()]
    dense_ft = [r["dense_ft"] for r in full.values() if "dense_ft" in r]
    (first, _), (loss, _) = metrics[:2]
    compressions = list(runs[0]["by_compression"])
    mean = {key: (_cell(_mean([d[key] for d in dense]), key), _cell(_mean([d[key] for d in dense_ft]), key) if dense_ft else "")
            for key in (first, loss)}
    lines = [f"Dense, trained {runs[0]['dense_steps']:,} steps: test {metrics[0][1]} {mean[first][0]}, {second} {mean[loss][0]}"
             + (f"; + {runs[0]['extra_steps']} steps: {mean[first][1]}, {mean[loss][1]}" if dense_ft else "")
             + f" ({len(dense)} seed{'s' if len(dense) > 1 else ''}); "
             f"small: a narrower dense model from scratch for all {runs[0]['dense_steps'] + runs[0]['extra_steps']:,} steps.",
             "",
             "| file | system | seeds | " + " | ".join(f"{c}×: " + ", ".join(name for _, name in metrics) for c in compressions) + " |",
             "|---|---|---|" + "---|" * len(compressions)]
    for stem, seeds in groups.items():
        ran = [c for c in compressions if c in seeds[0]["by_compression"]]  # a variant may run some sizes only
        for system in dict.fromkeys(name for r in seeds for name in r["by_compression"][ran[0]]):  # a seed may run more
            having = [r for r in seeds if system in r["by_compression"][ran[0]]]
            cells = [", ".join(_cell(_mean([r["by_compression"][c][system][key] for r in having]), key) for key, _ in metrics)
                     if c in ran else "–" for c in compressions]
            lines.append(f"| `{stem}` | {system} | {len(having)} | " + " | ".join(cells) + " |")
        if all("--systems" in r["command"] for r in seeds) and {r["args"]["seed"] for r in seeds} - set(full):
            cell = ", ".join(_cell(_mean([r["dense"][key] for r in seeds]), key) for key, _ in metrics)  # seeds of its own
            lines.append(f"| `{stem}` | dense (trained) | {len(seeds)} | " + " | ".join([cell] * len(compressions)) + " |")
        if all("dense_ft" in r and "--systems" in r["command"] for r in seeds):  # a variant's own dense + extra steps
            cell = ", ".join(_cell(_mean([r["dense_ft"][key] for r in seeds]), key) if key in seeds[0]["dense_ft"] else "–"
                             for key, _ in metrics)
            lines.append(f"| `{stem}` | dense_ft (uncompressed) | {len(seeds)} | " + " | ".join([cell] * len(compressions)) + " |")
    for source, result in results.items():  # the served programs of a file run with --served (one seed's)
        runs = [{**run, "system": system, "compression": float(c)} for c, systems in result["by_compression"].items()
                for system, run in systems.items()]
        lines += _served_rows(result["dense"].get("served"), runs, source)
    return "\n".join(lines)


def _cell(value: float, key: str) -> str:
    return f"{value:,.0f}" if key.endswith("parameters") else f"{value:.4f}" if key == "test_auc" else f"{value:.3f}"


def curves(results: dict[str, dict[str, Any]]) -> str:
    """Validation loss at each validation of one race system per file (``code`` names what ran), side by side."""
    columns = {}
    for source, result in results.items():
        (model,) = result["models"].values()
        (run,) = model["systems"].values()
        columns[f"{run['model']} {run['system']}, {result.get('code', source)}"] = run["curve"]
    return _curve_table(columns)


def _curve_table(curves: dict[str, list[dict[str, Any]]]) -> str:
    """One row per step, one column per named curve (its points' validation loss); "–" where a curve has no value."""
    columns = {name: {p["step"]: p["val_loss"] for p in points} for name, points in curves.items()}
    steps = sorted({step for curve in columns.values() for step in curve})
    lines = ["| step | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    lines += [f"| {step:,} | " + " | ".join(f"{curve[step]:.3f}" if step in curve else "–" for curve in columns.values()) + " |"
              for step in steps]
    return "\n".join(lines)


def compress_runs_with_curves(result: dict[str, Any], least: int = 10) -> str:
    """``compress_runs``, then the validation curves of the runs validated at least ``least`` times, side by side."""
    curved = [run for run in result["runs"] if len(run.get("curve", ())) >= least]
    if not curved:
        return compress_runs(result)
    curves = {f"{run['system']} ({run['compression']:g}×)": run["curve"] for run in curved}
    return f"{compress_runs(result)}\n\nValidation loss along the runs validated often:\n\n{_curve_table(curves)}"
