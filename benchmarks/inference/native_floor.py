"""Would a native kernel train TT tables as fast as fbgemm's fused dense ones? (issue #28)

``training_floor.py`` times the TT arithmetic no lookup can skip, in torch ops. This script adds
the same arithmetic as a native kernel, built on the spot with ``torch.utils.cpp_extension``
(needs a C++ compiler; about 45 s to build): a two-core train of rank R (``(4, R)·(R, 4)`` per
distinct id, 16-wide rows), forward and backward (dense core gradients, as a torch optimizer
needs), one loop per table over its ids, no SIMD intrinsics. Side by side in one process,
interleaved rounds: fbgemm's fused collection (forward + backward with the fused update), the
torch floor and the native floor at every ``--ranks``. Not part of the package: a measurement of
what a compiled extension could buy.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.inference.native_floor [--ranks 32,8] [--rounds 9] [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.inference.embedding_timing import interleave
from benchmarks.inference.embedding_workloads import make_workload
from benchmarks.inference.training_floor import MIN_ROWS, TwoCoreFloor, distinct_tt_ids
from benchmarks.probes import RESULTS, command_line, machine_basics

RANKS = (2, 4, 8, 16, 32)  # the ranks the kernel is compiled for (a template each)

KERNEL = r"""
#include <torch/extension.h>
template <int R>
void forward_rows(const float* left, const float* right, const int64_t* d0, const int64_t* d1, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float* a = left + d0[j] * 4 * R; const float* b = right + d1[j] * R * 4;
    float acc[16] = {0};
    for (int q = 0; q < R; ++q)
      for (int x = 0; x < 4; ++x) for (int y = 0; y < 4; ++y) acc[x * 4 + y] += a[x * R + q] * b[q * 4 + y];
    for (int k = 0; k < 16; ++k) out[j * 16 + k] = acc[k];
  }
}
template <int R>
void backward_rows(const float* g, const float* left, const float* right, const int64_t* d0, const int64_t* d1,
                   float* g_left, float* g_right, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float* a = left + d0[j] * 4 * R; const float* b = right + d1[j] * R * 4; const float* gj = g + j * 16;
    float* ga = g_left + d0[j] * 4 * R; float* gb = g_right + d1[j] * R * 4;
    for (int x = 0; x < 4; ++x) for (int q = 0; q < R; ++q)
      ga[x * R + q] += gj[x * 4] * b[q * 4] + gj[x * 4 + 1] * b[q * 4 + 1] + gj[x * 4 + 2] * b[q * 4 + 2] + gj[x * 4 + 3] * b[q * 4 + 3];
    for (int q = 0; q < R; ++q) for (int y = 0; y < 4; ++y)
      gb[q * 4 + y] += a[q] * gj[y] + a[R + q] * gj[4 + y] + a[2 * R + q] * gj[8 + y] + a[3 * R + q] * gj[12 + y];
  }
}
#define DISPATCH(R, CALL) switch (R) { case 2: CALL(2); break; case 4: CALL(4); break; case 8: CALL(8); break; \
  case 16: CALL(16); break; case 32: CALL(32); break; default: TORCH_CHECK(false, "rank not compiled"); }
torch::Tensor rows(torch::Tensor left, torch::Tensor right, torch::Tensor d0, torch::Tensor d1, int64_t rank) {
  auto out = torch::empty({d0.size(0), 16}, left.options());
#define FWD(R) forward_rows<R>(left.data_ptr<float>(), right.data_ptr<float>(), d0.data_ptr<int64_t>(), d1.data_ptr<int64_t>(), out.data_ptr<float>(), d0.size(0))
  DISPATCH(rank, FWD)
  return out;
}
std::vector<torch::Tensor> rows_backward(torch::Tensor g, torch::Tensor left, torch::Tensor right, torch::Tensor d0, torch::Tensor d1, int64_t rank) {
  auto g_left = torch::zeros_like(left); auto g_right = torch::zeros_like(right);
#define BWD(R) backward_rows<R>(g.data_ptr<float>(), left.data_ptr<float>(), right.data_ptr<float>(), d0.data_ptr<int64_t>(), \
  d1.data_ptr<int64_t>(), g_left.data_ptr<float>(), g_right.data_ptr<float>(), d0.size(0))
  DISPATCH(rank, BWD)
  return {g_left, g_right};
}
"""


def build_kernel() -> tuple[Any, type]:
    """The compiled extension and an autograd Function over it: ``apply(left, right, d0, d1, rank)``."""
    import torch
    from torch.utils.cpp_extension import load_inline

    kernel = load_inline("comera_native_floor", cpp_sources=KERNEL, functions=["rows", "rows_backward"],
                         extra_cflags=["-O3", "-march=native"])

    class NativeRows(torch.autograd.Function):
        @staticmethod
        def forward(ctx, left, right, d0, d1, rank):
            ctx.save_for_backward(left, right, d0, d1)
            ctx.rank = rank
            return kernel.rows(left, right, d0, d1, rank)

        @staticmethod
        def backward(ctx, grad):
            left, right, d0, d1 = ctx.saved_tensors
            g_left, g_right = kernel.rows_backward(grad.contiguous(), left, right, d0, d1, ctx.rank)
            return g_left, g_right, None, None, None

    return kernel, NativeRows


def native_step(floor: TwoCoreFloor, native_rows: type, ids: list[Any]) -> None:
    """``floor.step`` with the native kernel instead of gathers and ``bmm`` (the same cores, the same rows)."""
    import torch

    outputs = [native_rows.apply(left, right, i // n2, i % n2, floor.rank) for (n2, left, right), i in zip(floor.cores, ids)]
    torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])
    for _, left, right in floor.cores:
        left.grad = right.grad = None


def check_equal(floor: TwoCoreFloor, native_rows: type, ids: Any) -> float:
    """Largest difference between the native rows (and left-core gradient) and the torch floor's, on one table."""
    import torch
    import torch.nn.functional as F

    n2, left, right = floor.cores[0]
    torch_rows = torch.bmm(F.embedding(ids // n2, left).view(-1, 4, floor.rank), F.embedding(ids % n2, right).view(-1, floor.rank, 4))
    ours = native_rows.apply(left, right, ids // n2, ids % n2, floor.rank)
    grad = torch.randn_like(ours)
    (expected,) = torch.autograd.grad(torch_rows.view(-1, 16), left, grad)
    (got,) = torch.autograd.grad(ours, left, grad)
    return max(float((torch_rows.view(-1, 16) - ours).detach().abs().max()), float((expected - got).abs().max()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="32,8")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="Criteo tables capped at QUICK_MAX_ROWS rows (the test)")
    parser.add_argument("--out", type=Path, default=RESULTS / "native_floor.json")
    args = parser.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    if not set(ranks) <= set(RANKS):
        parser.error(f"--ranks must be among {RANKS} (the ranks the kernel is compiled for)")
    import torch
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    torch.set_num_threads(1)
    _, native_rows = build_kernel()
    workload = make_workload("criteo", quick=args.quick)
    batches = workload.batches(args.batch, args.warmup + args.rounds, seed=1)
    distinct = [distinct_tt_ids(batch, workload.table_sizes) for batch in batches]
    dense = FusedEmbeddingBagCollection(workload.configs(16), optimizer_type=torch.optim.Adagrad,
                                        optimizer_kwargs={"lr": 0.01}, device=torch.device("cpu"))
    calls = {"dense": lambda i: dense(batches[i].sparse).values().backward(torch.ones(args.batch, 26 * 16))}
    differences = {}
    for rank in ranks:
        floor = TwoCoreFloor([n for n in workload.table_sizes if n >= MIN_ROWS], rank, seed=0)
        differences[rank] = check_equal(floor, native_rows, distinct[0][0])
        calls[f"torch_r{rank}"] = lambda i, floor=floor: floor.step(distinct[i])
        calls[f"native_r{rank}"] = lambda i, floor=floor: native_step(floor, native_rows, distinct[i])
    timed = interleave(calls, args.rounds, args.warmup, 1)
    report = {"host": {**machine_basics(), "torch": torch.__version__, "threads": 1}, "command": command_line(),
              "settings": {"ranks": ranks, "batch": args.batch, "rounds": args.rounds, "warmup": args.warmup},
              "max_difference_vs_torch": differences, **timed}
    args.out.write_text(json.dumps(report, indent=1, default=str))
    for name, ms in timed["ms_median"].items():
        ratio = timed["dense_over_paired"].get(name)
        print(f"{name:10s} {ms:8.2f} ms" + (f"   dense/{name} {ratio:.2f}x" if ratio is not None else ""))
    return report


if __name__ == "__main__":
    main()
