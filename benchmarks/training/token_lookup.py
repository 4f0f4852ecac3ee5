"""LLaMA-60M's token table looked up by each route, forward and backward, side by side in one process.

The table as the callback starts LLaMA-60M's vocabulary with its defaults (32,000 x 512 as two factors at rank 440:
``(200, 32, 440)`` and ``(160, 440, 16)``; ``gpu_speed.py``'s CoMERA rows run it so), 8,192 uniform ids
(``gpu_runs.py``'s batch of 32 x 256 synthetic tokens), one fixed output gradient, under bf16 autocast as the GPU runs
train (``--precision 32-true``: without). Routes:

* ``nn.Embedding``: the dense table's gather and its gradient;
* ``whole table``: ``kernels/full_table.py`` (one GEMM builds every row; the lookup and its backward are a dense
  embedding's; what the layer takes on a GPU where a step looks up about as many ids as the table has rows);
* ``per-id kernel``: the fused Triton op (CUDA only), and ``per-id kernel, recomputed``: the same inside the
  activation checkpoint the layer wrapped it in before 2026-11-30's cut (its forward ran twice a step);
* ``torch path``: gathers and a batched product per id, recomputed in backward (what the layer runs on CPU).

Reports the median milliseconds of interleaved rounds and the ratios over ``nn.Embedding`` and over the per-id kernel;
beside them each route's count (``op_tally``: kernels, GEMM FLOPs, bytes the other kernels move) and the per-id
kernel's, which ``op_tally`` cannot see inside: its multiply-adds and the fp32 atomic adds of its backward.
``--check``: a small table, on CPU (the tests run it).

    python -m benchmarks.training.token_lookup [--device cuda] [--precision bf16-mixed] [--steps 20] [--warmup 3] [--check]
        [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from benchmarks.probes import RESULTS, command_line, machine_basics, write_result
from benchmarks.training.op_tally import OpTally
from benchmarks.training.strategy_speed import interleaved_ms
from comera_lightning.layers.kernels.full_table import full_table_rows
from comera_lightning.layers.kernels.reference import rows_reference

#: (N_L, M_L, r, N_R, M_R) and ids: LLaMA-60M's token table at batch 32 x 256; ``--check``'s.
SHAPE = {"factors": (200, 32, 440, 160, 16), "ids": 8192}
CHECK_SHAPE = {"factors": (20, 4, 16, 16, 4), "ids": 256}


def routes(left: torch.Tensor, right: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
           kernel: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """Each route's forward (the rows), from the same factors and ids; the per-id kernel's only where it runs."""
    table = {"nn.Embedding": lambda: F.embedding(ids, weight), "whole table": lambda: full_table_rows(left, right, ids),
             "torch path": lambda: checkpoint(rows_reference, left, right, ids, use_reentrant=False)}
    if kernel:
        from comera_lightning.layers.kernels import ops

        fused = lambda *a: ops._bags_op(*a, None, None, False)  # noqa: E731
        table["per-id kernel"] = lambda: fused(left, right, ids)
        table["per-id kernel, recomputed"] = lambda: checkpoint(fused, left, right, ids, use_reentrant=False)
    return table


def _autocast(forward: Callable[[], torch.Tensor], device: torch.device, on: bool) -> torch.Tensor:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on):
        return forward()


def counted(forward: Callable[[], torch.Tensor], grad: torch.Tensor) -> dict[str, int]:
    """One forward and backward through ``op_tally``: kernels, GEMM FLOPs, other bytes (both phases together)."""
    tally = OpTally()
    with tally:
        tally.counting = True
        with tally.phase_of("forward"):
            rows = forward()
        with tally.phase_of("backward"):
            rows.backward(grad)
    both = [tally.counts["forward"], tally.counts["backward"]]
    return {"kernels": sum(c.kernels for c in both), "gemm_flops": sum(c.gemm_flops for c in both),
            "other_bytes": sum(c.other_bytes for c in both)}


def token_lookup(device: torch.device, check: bool, warmup: int, steps: int, precision: str = "bf16-mixed") -> dict[str, Any]:
    """Milliseconds per forward and backward by route, their ratios, and the counts."""
    shape = CHECK_SHAPE if check else SHAPE
    n_left, m_left, rank, n_right, m_right = shape["factors"]
    torch.manual_seed(0)
    left = torch.randn(n_left, m_left, rank, device=device, requires_grad=True)
    right = torch.randn(n_right, rank, m_right, device=device, requires_grad=True)
    weight = torch.randn(n_left * n_right, m_left * m_right, device=device, requires_grad=True)
    ids = torch.randint(0, n_left * n_right, (shape["ids"],), device=device)
    grad = torch.randn(shape["ids"], m_left * m_right, device=device)
    autocast = precision == "bf16-mixed"
    forwards = {name: (lambda f=forward: _autocast(f, device, autocast))
                for name, forward in routes(left, right, weight, ids, kernel=device.type == "cuda").items()}
    calls = {name: (lambda f=forward: f().backward(grad)) for name, forward in forwards.items()}
    times = interleaved_ms(calls, argparse.Namespace(warmup=warmup, steps=steps), device)
    ms = {name: statistics.median(values) for name, values in times.items()}
    counts = {name: counted(forward, grad) for name, forward in forwards.items()}
    macs = shape["ids"] * m_left * m_right * rank
    kernel = ms.get("per-id kernel")
    return {"factors": shape["factors"], "rows": n_left * n_right, "width": m_left * m_right, "rank": rank,
            "ids": shape["ids"], "device": str(device), "precision": precision, "ms": ms,
            "over_embedding": {name: t / ms["nn.Embedding"] for name, t in ms.items()},
            "over_kernel": {name: t / kernel for name, t in ms.items()} if kernel else None,
            "counts": counts, "per_id_kernel": {"gemm_flops": 3 * 2 * macs,  # forward, and each factor's gradient
                                                "atomic_adds": shape["ids"] * (m_left + m_right) * rank}}


def route_table(r: dict[str, Any]) -> list[str]:
    """:func:`token_lookup`'s result as markdown lines: the table, the counts, one route a row."""
    lines = [f"Two factors {r['factors']} ({r['rows']:,} x {r['width']} at rank {r['rank']}), {r['ids']:,} ids, forward and "
             f"backward on {r['device']}, {r.get('precision', '32-true')}. Per-id kernel (counted by formula): {r['per_id_kernel']['gemm_flops'] / 1e9:.2f} GFLOP, "
             f"{r['per_id_kernel']['atomic_adds'] / 1e6:.1f} M fp32 atomic adds.", "",
             "| route | ms | x nn.Embedding | x per-id kernel | kernels | GEMM GFLOP | other MB |", "|---|---|---|---|---|---|---|"]
    for name, ms in r["ms"].items():
        c = r["counts"][name]
        vs_kernel = f"{r['over_kernel'][name]:.2f}" if r["over_kernel"] else "-"
        lines.append(f"| {name} | {ms:.3f} | {r['over_embedding'][name]:.2f} | {vs_kernel} | {c['kernels']} | "
                     f"{c['gemm_flops'] / 1e9:.2f} | {c['other_bytes'] / 1e6:.1f} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The routes as a markdown table, headed by the device and the command."""
    header = f"Token-table lookup by route on **{result['machine']['device']}** ({result['date']}): `{result['command']}`"
    return "\n".join([header, "", *route_table(result["lookup"])]) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="a small table on CPU")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.check else args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    result = {"command": command_line(argv), "date": datetime.date.today().isoformat(),
              "machine": {**machine_basics(), "device": name, "torch": torch.__version__},
              "lookup": token_lookup(device, args.check, args.warmup, 2 if args.check else args.steps, args.precision)}
    out = args.out or RESULTS / ("token_lookup_check.json" if args.check else f"token_lookup_{device.type}.json")
    write_result(out, result, markdown(result))
    return result


if __name__ == "__main__":
    main()
