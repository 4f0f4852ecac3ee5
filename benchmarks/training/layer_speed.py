"""Layer micro-benchmark: TTLinear vs nn.Linear and TTEmbedding vs nn.Embedding, side by side.

Forward + backward at the paper's shapes (768×768, 768×3072, 3072×768 at rank 30; a
30,522×768 table at rank 32), 32 × 128 tokens, all in one process. Also times the naive TT
baselines the paper beats (materialise the dense weight/table from the cores every step).
Prints time ratios, parameter ratios and achieved GFLOP/s next to the dense GEMM's, and
writes JSON.

    python -m benchmarks.training.layer_speed [--device cuda] [--reps 20] [--threads 1] [--out benchmarks/results/layer_speed.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.probes import machine_basics
from comera_lightning import TTEmbedding, TTLinear


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fwd_bwd(step, device: torch.device, reps: int, warmup: int = 3) -> float:
    """Median seconds of ``step()`` (which runs forward and backward)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def linear_case(d_in: int, d_out: int, rank: int, tokens: int, device: torch.device, reps: int) -> dict:
    """Dense, naive-TT (rebuild W) and our TT forward+backward on one linear shape."""
    x = torch.randn(tokens, d_in, device=device, requires_grad=True)
    grad = torch.randn(tokens, d_out, device=device)
    dense = nn.Linear(d_in, d_out, device=device)
    tt = TTLinear(d_in, d_out, max_rank=rank, device=device)

    def run(module_or_fn):
        def step():
            module_or_fn(x).backward(grad)
        return step

    def naive(inp):  # the classic approach: contract the cores into W every step, then a dense GEMM
        return nn.functional.linear(inp, tt.weight_matrix(), tt.bias)

    t_dense = time_fwd_bwd(run(dense), device, reps)
    t_naive = time_fwd_bwd(run(naive), device, reps)
    t_tt = time_fwd_bwd(run(tt), device, reps)
    dense_flops = 3 * 2 * tokens * d_in * d_out  # forward, grad input, grad weight
    tt_flops = 3 * 2 * tt._split_cost(tt.best_split(tokens), tokens)
    return {
        "layer": f"linear {d_in}x{d_out} r={rank}",
        "dense_ms": t_dense * 1e3, "naive_tt_ms": t_naive * 1e3, "tt_ms": t_tt * 1e3,
        "speedup_vs_dense": t_dense / t_tt, "speedup_vs_naive_tt": t_naive / t_tt,
        "dense_params": sum(p.numel() for p in dense.parameters()), "tt_params": tt.num_parameters(),
        "param_ratio": sum(p.numel() for p in dense.parameters()) / tt.num_parameters(),
        "dense_gflops": dense_flops / t_dense / 1e9, "tt_gflops": tt_flops / t_tt / 1e9,
    }


def embedding_case(rows: int, dim: int, rank: int, num_ids: int, device: torch.device, reps: int) -> dict:
    """Dense, naive-TT (rebuild the table) and our fast TT lookup, forward+backward."""
    ids = torch.randint(0, rows, (num_ids,), device=device)
    grad = torch.randn(num_ids, dim, device=device)
    dense = nn.Embedding(rows, dim, device=device)
    tt = TTEmbedding(rows, dim, max_rank=rank, device=device)
    tt_dedup = TTEmbedding(rows, dim, max_rank=rank, deduplicate=True, device=device)
    tt_dedup.load_state_dict(tt.state_dict())

    def run(fn):
        def step():
            fn(ids).backward(grad)
        return step

    t_dense = time_fwd_bwd(run(dense), device, reps)
    t_naive = time_fwd_bwd(run(lambda i: tt.weight_table()[i]), device, max(3, reps // 4))
    t_tt = time_fwd_bwd(run(tt), device, reps)
    t_tt_dedup = time_fwd_bwd(run(tt_dedup), device, reps)
    return {
        "layer": f"embedding {rows}x{dim} r={rank}, {num_ids} ids",
        "dense_ms": t_dense * 1e3, "naive_tt_ms": t_naive * 1e3, "tt_ms": t_tt * 1e3, "tt_dedup_ms": t_tt_dedup * 1e3,
        "time_ratio_tt_over_dense": t_tt / t_dense, "speedup_vs_naive_tt": t_naive / t_tt,
        "dense_params": dense.weight.numel(), "tt_params": tt.num_parameters(),
        "param_ratio": dense.weight.numel() / tt.num_parameters(),
    }


def machine() -> dict:
    """What the numbers were measured on."""
    info = {**machine_basics(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=32 * 128)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--out", default="benchmarks/results/layer_speed.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)

    results = [linear_case(i, o, 30, args.tokens, device, args.reps) for i, o in [(768, 768), (768, 3072), (3072, 768)]]
    results.append(embedding_case(30522, 768, 32, 4096, device, args.reps))
    meta = machine()
    print(f"# {meta}")
    print(f"{'layer':<38} {'dense ms':>9} {'naive TT':>9} {'TT ms':>8} {'dense/TT':>9} {'naive/TT':>9} {'params x':>9} {'GFLOP/s dense|TT':>17}")
    for r in results:
        ratio = r.get("speedup_vs_dense", 1 / r.get("time_ratio_tt_over_dense", float("nan")))
        flops = f"{r['dense_gflops']:.0f} | {r['tt_gflops']:.0f}" if "dense_gflops" in r else "-"
        print(
            f"{r['layer']:<38} {r['dense_ms']:9.2f} {r['naive_tt_ms']:9.2f} {r['tt_ms']:8.2f} {ratio:8.2f}x "
            f"{r['speedup_vs_naive_tt']:8.2f}x {r['param_ratio']:8.1f}x {flops:>17}"
        )
    emb = results[-1]
    print(f"embedding with dedup (unique ids first): {emb['tt_dedup_ms']:.2f} ms ({emb['tt_dedup_ms'] / emb['dense_ms']:.2f}x dense)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": meta, "tokens": args.tokens, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
