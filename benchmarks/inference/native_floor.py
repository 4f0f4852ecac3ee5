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

from typing import Any

from benchmarks.inference.embedding_timing import interleave
from benchmarks.inference.training_floor import TwoCoreFloor, backward_of, criteo_batches, floor_parser, fused_dense, tt_sizes, write_report

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


def check_equal(floor: TwoCoreFloor, native_rows: type, ids: Any) -> float:
    """Largest difference between the native rows (and left-core gradient) and the torch floor's, on one table."""
    import torch

    n2, left, right = floor.cores[0]
    expected_rows = floor.torch_rows(n2, left, right, ids).view(-1, 16)
    ours = native_rows.apply(left, right, ids // n2, ids % n2, floor.rank)
    grad = torch.randn_like(ours)
    (expected,) = torch.autograd.grad(expected_rows, left, grad)
    (got,) = torch.autograd.grad(ours, left, grad)
    return max(float((expected_rows - ours).detach().abs().max()), float((expected - got).abs().max()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = floor_parser(__doc__.splitlines()[0], "32,8", "native_floor.json")
    args = parser.parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",")]
    if not set(args.ranks) <= set(RANKS):
        parser.error(f"--ranks must be among {RANKS} (the ranks the kernel is compiled for)")
    _, native_rows = build_kernel()
    workload, batches, distinct = criteo_batches(args)
    dense = fused_dense(workload.configs(16))
    calls = {"dense": lambda i: backward_of(dense, batches[i])}
    differences = {}
    for rank in args.ranks:
        floor = TwoCoreFloor(tt_sizes(workload), rank, args.seed)
        differences[rank] = check_equal(floor, native_rows, distinct[0][0])

        def native(n2: int, left: Any, right: Any, ids: Any, rank: int = rank) -> Any:
            return native_rows.apply(left, right, ids // n2, ids % n2, rank)

        calls[f"torch_r{rank}"] = lambda i, floor=floor: floor.step(distinct[i])
        calls[f"native_r{rank}"] = lambda i, floor=floor, native=native: floor.step(distinct[i], native)
    return write_report(args, interleave(calls, args.rounds, args.warmup, 1), max_difference_vs_torch=differences)


if __name__ == "__main__":
    main()
