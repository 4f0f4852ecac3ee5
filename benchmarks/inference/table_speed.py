"""A plain ``TTEmbedding`` served beside ``nn.Embedding`` (issue #45): speed, memory and exactness, one process.

Systems, eval mode under ``torch.inference_mode``, one torch thread:

* ``dense``: ``nn.Embedding`` holding the trained TT table's values (``TTEmbedding.to_embedding()``);
* ``tt``: ``TTEmbedding(rows, dim, max_rank=R)`` with the defaults (a 4 MiB hot-row cache; ``--cache-rows``), trained
  for ``--train-batches`` batches (Adagrad on a random linear loss): its training-mode forwards count the ids;
* ``tt_pruned``: ``tt`` with a third of every bond kept, then ``prune_`` (what CoMERA's late stage leaves);
* ``export_cores`` / ``export_halves``: ``tt``'s ``export`` form (``export.choice.embedding_form`` with
  ``hot_rows=True``): the cores and the hot rows, misses through the core chain, or the half tables and the hot
  rows (``miss_tables=True``), misses through the eager layer's product; run eagerly (the ops an exported program runs).

Ids: Zipf(``--zipf``) ranks scattered over the table by a fixed permutation (``embedding_workloads``),
``--batch`` bags of ``--bag`` ids (a ``(batch, bag)`` tensor in, ``(batch, bag, dim)`` rows out); training
and timed batches from different seeds. Timing (``embedding_timing.interleave``): per round each system
once on that round's batch, order rotated; ``dense_over_paired`` is the median of the rounds' own
dense/system ratios (``cores_over_halves_paired``: the two export forms' own). Twice: wall clock, and the
thread's CPU time (on a shared host a process that is descheduled mid-call is charged wall time it did not run).

Also: bytes (dense: its weight; TT: ``inference_bytes()``, i.e. parameters, buffers and the serving
cache, with the cache's parts), the misses per batch, exactness (the cached rows against the same ids
contracted as misses, bitwise; served rows against training-mode rows and the dense table), and
``layouts``: the misses' row products with the right half tables stored as they are and transposed;
``phases``: the CPU time of a served batch's steps (hash find, misses, final gather) beside dense's lookup.

    OMP_NUM_THREADS=1 WANDB_MODE=disabled .venv/bin/python -m benchmarks.inference.table_speed [--rounds 15] [--quick] [--out PATH]

About 60 s and 1.3 GB on 2 shared cores (``--quick``: a few seconds).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.inference.embedding_timing import interleave
from benchmarks.inference.embedding_workloads import ZIPF_A, scatter, zipf_ranks
from benchmarks.probes import RESULTS, command_line, machine_basics, without_out

KEEP_FRACTION = 1 / 3
QUICK = {"rows": 100_000, "dim": 64, "max_rank": 8, "batch": 256, "rounds": 3, "warmup": 1, "train_batches": 3}


def zipf_batches(args: argparse.Namespace, count: int, seed: int) -> list[Any]:
    """``count`` ``(batch, bag)`` int64 id tensors, Zipf ranks scattered over the table."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    return [torch.from_numpy(scatter(zipf_ranks(rng, args.rows, args.batch * args.bag, args.zipf), args.rows, 0)).view(args.batch, args.bag)
            for _ in range(count)]


def trained_table(args: argparse.Namespace) -> Any:
    """``TTEmbedding`` with the defaults, after ``--train-batches`` Adagrad steps (which count its ids)."""
    import torch

    from comera_lightning import TTEmbedding

    torch.manual_seed(args.seed)
    table = TTEmbedding(args.rows, args.dim, max_rank=args.max_rank, num_cores=args.num_cores, cache_rows=args.cache_rows)
    optimizer = torch.optim.Adagrad(table.parameters(), lr=0.01)
    direction = torch.randn(args.dim)
    for ids in zipf_batches(args, args.train_batches, args.seed + 100):
        loss = (table(ids) @ direction).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return table.eval()


def pruned(table: Any) -> Any:
    """A copy with ``round(KEEP_FRACTION · r)`` gates kept in every bond, the rest pruned away."""
    import torch

    from comera_lightning.rank import prune_

    other = copy.deepcopy(table)
    with torch.no_grad():
        for gate in other.gates:
            gate[max(1, round(KEEP_FRACTION * gate.numel())):] = 0.0
    prune_(other)
    return other.eval()


def exported_forms(table: Any) -> dict[str, Any]:
    """``tt``'s two ``export`` forms: cores + hot rows, half tables + hot rows (``miss_tables=True``)."""
    from comera_lightning.export.choice import embedding_form

    forms = {"export_cores": embedding_form(table, hot_rows=True), "export_halves": embedding_form(table, hot_rows=True, miss_tables=True)}
    return {name: chosen.module.eval() for name, chosen in forms.items()}


def time_systems(systems: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds of every system on its own copy of each round's batch, by wall clock and by CPU time."""
    import torch

    batches = zipf_batches(args, args.warmup + args.rounds, args.seed + 1)
    calls = {name: (lambda i, m=module, b=[x.clone() for x in batches]: m(b[i])) for name, module in systems.items()}
    with torch.inference_mode():
        timed = {"wall": interleave(calls, args.rounds, args.warmup, 1),
                 "cpu": interleave(calls, args.rounds, args.warmup, 1, clock=time.thread_time)}
    for clock in timed.values():  # the two export forms against each other, paired in time as against dense
        rounds = clock["ms_rounds"]
        clock["cores_over_halves_paired"] = statistics.median(c / h for c, h in zip(rounds["export_cores"], rounds["export_halves"]))
    return timed


def memory(systems: dict[str, Any]) -> dict[str, Any]:
    """Bytes each system holds for serving, and what a TT table's serving cache is made of."""
    import torch

    out: dict[str, Any] = {"bytes": {}, "tt_parts": {}}
    for name, module in systems.items():
        if not hasattr(module, "inference_bytes"):  # dense, or an export form: what it stores
            out["bytes"][name] = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
            continue
        out["bytes"][name] = module.inference_bytes()
        with torch.inference_mode():  # the serving state the timed calls built (with grad on it is built afresh)
            serving = module.serving()
        row_bytes = module.embedding_dim * module.cores[0].element_size()
        out["tt_parts"][name] = {
            "cores_and_gates": sum(p.numel() * p.element_size() for p in module.parameters()),
            "id_counts_and_masks": sum(b.numel() * b.element_size() for b in module.buffers()),
            "cached_rows": serving.cached_rows() * row_bytes,
            "spare_rows": serving.served.nbytes() - serving.cached_rows() * row_bytes,
            "hash_index": serving.index.nbytes() if serving.index is not None else 0,
            "half_tables": serving.halves.nbytes() if serving.halves is not None else 0,
        }
    dense = out["bytes"]["dense"]
    out["dense_over"] = {name: dense / b for name, b in out["bytes"].items() if name != "dense"}
    return out


def exactness(table: Any, dense: Any, ids: Any) -> dict[str, Any]:
    """Cached rows against the same ids contracted as misses (bitwise); served rows against training-mode and dense rows."""
    import torch

    with torch.inference_mode():
        served = table(ids)
        serving = table.serving()
        hot = table.hot_ids()
        position, hit = serving.index.find(hot)
        cached = serving.served.rows.index_select(0, position[hit].long())
        as_misses = serving.halves.rows(hot[hit])
        from_dense = dense(ids)
    with torch.enable_grad():  # autograd on: contracted from the cores, no cache (the training-mode lookup)
        contracted = table(ids).detach()
    scale = contracted.abs().max().item()
    return {"cached_rows_checked": int(hit.sum()), "cached_equal_misses_bitwise": bool(torch.equal(cached, as_misses)),
            "max_abs_vs_training_rows": (served - contracted).abs().max().item(),
            "max_abs_vs_dense": (served - from_dense).abs().max().item(), "max_abs_row_value": scale}


def misses(table: Any, batches: list[Any]) -> list[Any]:
    """The ids of each batch the hot rows do not hold."""
    import torch

    with torch.inference_mode():
        index = table.serving().index
        return [ids.reshape(-1)[~index.find(ids.reshape(-1))[1]] for ids in batches]


def layouts(table: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The misses' row products (two gathers and one ``bmm``) with the right half tables as stored and transposed."""
    import torch

    with torch.inference_mode():
        halves = table.serving().halves
    other = copy.copy(halves)
    other.transposed = not halves.transposed
    other.right = halves.right.transpose(1, 2).contiguous()
    missed = misses(table, zipf_batches(args, args.warmup + args.rounds, args.seed + 2))
    named = {"transposed": halves if halves.transposed else other, "plain": other if halves.transposed else halves}
    calls = {name: (lambda i, h=h: h.rows(missed[i])) for name, h in named.items()}
    with torch.inference_mode():
        timed = interleave(calls, args.rounds, args.warmup, 1, clock=time.thread_time)
        rounds = timed["ms_rounds"]
        pairs = [(named["plain"].rows(m), named["transposed"].rows(m)) for m in missed[:2]]
    # the same products summed in another memory order: equal to rounding (bitwise on some BLAS builds, not on all)
    difference = max((p - t).abs().max().item() / max(p.abs().max().item(), 1e-30) for p, t in pairs)
    return {"chosen": "transposed" if halves.transposed else "plain", "cpu_ms_median": timed["ms_median"],
            "plain_over_transposed_paired": statistics.median(p / t for p, t in zip(rounds["plain"], rounds["transposed"])),
            "misses_per_batch": statistics.median(m.numel() for m in missed), "max_relative_difference": difference,
            "shape": {"left": list(halves.left.shape), "right_stored": list(halves.right.shape)}}


def phases(table: Any, dense: Any, args: argparse.Namespace) -> dict[str, Any]:
    """CPU time of a served batch's steps (hash find, the misses' contraction, the final gather) beside dense's whole lookup."""
    import torch
    import torch.nn.functional as F

    batches = [ids.reshape(-1) for ids in zipf_batches(args, args.warmup + args.rounds, args.seed + 4)]
    with torch.inference_mode():
        serving = table.serving()
        for ids in batches:
            serving.rows(ids)  # the spare rows grow to the largest batch's misses
        found = [serving.index.find(ids) for ids in batches]
        missed = [ids[~hit] for ids, (_, hit) in zip(batches, found)]
        positions = [torch.where(hit, position, serving.cached_rows() + torch.cumsum(~hit, 0, dtype=torch.int32) - 1)
                     for position, hit in found]
        calls = {"dense": lambda i: dense(batches[i]), "find": lambda i: serving.index.find(batches[i]),
                 "misses": lambda i: serving.served.add_misses(missed[i], batches[i].numel(), serving.halves.rows),
                 "gather": lambda i: F.embedding(positions[i], serving.served.rows)}
        timed = interleave(calls, args.rounds, args.warmup, 1, clock=time.thread_time)
    return {"cpu_ms_median": timed["ms_median"], "misses_per_batch": statistics.median(m.numel() for m in missed)}


def markdown(report: dict[str, Any]) -> str:
    """One row per system: wall and CPU ms with (dense/system, median of paired rounds), MB with (dense/system)."""
    timing, sizes = report["timing"], report["memory"]
    lines = ["| system | wall ms | CPU ms | serving MB |", "|---|---|---|---|"]
    for name in timing["wall"]["ms_median"]:
        cells = []
        for clock in ("wall", "cpu"):
            ratio = timing[clock].get("dense_over_paired", {}).get(name)
            cells.append(f"{timing[clock]['ms_median'][name]:.3f}" + (f" ({ratio:.2f}×)" if ratio is not None else ""))
        ratio = sizes["dense_over"].get(name)
        cells.append(f"{sizes['bytes'][name] / 1e6:.2f}" + (f" ({ratio:.1f}×)" if ratio is not None else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("\nexport forms, cores + hot rows / half tables + hot rows (median of paired rounds): wall "
                 f"{timing['wall']['cores_over_halves_paired']:.2f}×, CPU {timing['cpu']['cores_over_halves_paired']:.2f}×")
    exact, layout = report["exactness"], report["layouts"]
    lines.append(f"\ncached rows bitwise equal to the same ids contracted as misses: {exact['cached_equal_misses_bitwise']} "
                 f"({exact['cached_rows_checked']} rows); served vs training-mode rows: max |diff| {exact['max_abs_vs_training_rows']:.2e} "
                 f"(rows up to {exact['max_abs_row_value']:.2e}); vs dense: {exact['max_abs_vs_dense']:.2e}")
    steps = report["phases"]["cpu_ms_median"]
    lines.append(f"CPU ms per batch: dense {steps['dense']:.3f}; tt's steps: hash find {steps['find']:.3f}, "
                 f"misses ({report['phases']['misses_per_batch']}) {steps['misses']:.3f}, final gather {steps['gather']:.3f}")
    lines.append(f"misses' products ({layout['misses_per_batch']} per batch): plain / transposed CPU time "
                 f"{layout['plain_over_transposed_paired']:.2f} (chosen: {layout['chosen']})")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--max-rank", type=int, default=32)
    parser.add_argument("--num-cores", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4096, help="bags per batch")
    parser.add_argument("--bag", type=int, default=8, help="ids per bag")
    parser.add_argument("--cache-rows", type=int, default=None, help="the TT table's hot rows (default: the layer's, 4 MiB of rows)")
    parser.add_argument("--zipf", type=float, default=ZIPF_A)
    parser.add_argument("--train-batches", type=int, default=20, help="training batches before serving (they count the ids)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help=f"a small table: {QUICK}")
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/table_speed[_quick].json")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    if min(args.rounds, args.warmup, args.train_batches, args.rows, args.batch, args.bag) < 1:
        parser.error("--rounds, --warmup, --train-batches, --rows, --batch and --bag must be at least 1.")
    args.out = args.out or RESULTS / f"table_speed{'_quick' if args.quick else ''}.json"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import datetime

    import torch

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    table = trained_table(args)
    systems = {"dense": table.to_embedding().eval(), "tt": table, "tt_pruned": pruned(table), **exported_forms(table)}
    timing = time_systems(systems, args)
    report: dict[str, Any] = {
        "benchmark": "table_speed", "command": command_line(["-m", __spec__.name, *without_out(argv)]),
        "host": {**machine_basics(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")},
        "settings": {k: v for k, v in vars(args).items() if k != "out"}, "timing": timing, "memory": memory(systems),
        "exactness": exactness(table, systems["dense"], zipf_batches(args, 1, args.seed + 3)[0]),
        "layouts": layouts(table, args), "phases": phases(table, systems["dense"], args),
    }
    report["markdown"] = markdown(report)
    report["wall_s"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(report["markdown"])
    return report


if __name__ == "__main__":
    main()
