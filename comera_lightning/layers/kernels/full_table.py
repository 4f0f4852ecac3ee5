"""The two-factor lookup through the whole table: one GEMM builds every row, the lookup is a dense embedding's.

Where a step looks up nearly as many ids as the table has rows (a language model's vocabulary: 8,192 tokens a step
in a 32,000-row table), building the table ``left @ right`` in one GEMM and gathering from it costs less than the
per-id products: the fused kernel's backward adds each id's ``(M_L, r)`` and ``(r, M_R)`` gradient slices atomically
into the few slices every id shares, and at LLaMA-60M's shape it took 2.28 ms of a 28.9 ms step on an H200
(docs/STEP_COST.md). Through the table the backward is a dense embedding's (the ids' gradients summed into the
table's) and two GEMMs; nothing larger than the factors and ids is kept for it. Under autocast the GEMMs run in its
dtype, as every linear layer's (bf16 tensor cores on a GPU), and the rows come back in the factors' dtype, as a dense
embedding's do (a residual stream stays fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from comera_lightning.layers.bag_pooling import pool_bags

__all__ = ["MAX_TABLE_ELEMENTS", "ROWS_PER_LOOKUP", "full_table", "full_table_bags", "full_table_fits", "full_table_pays",
           "full_table_rows"]

#: The whole table pays where it has at most this many rows per id looked up. Modeled, not measured: the 2026-11-30
#: H200 profile's per-id kernels ran 11.1 GFLOP in 3.06 ms (3.6 TFLOP/s, atomics included; rank 440); the table's
#: three GEMMs of ``2·N·M·r`` FLOPs break even near 14 rows per id at 50 TFLOP/s (fp32), near 60 at the 214 TFLOP/s
#: the device model fitted for bf16 GEMMs (docs/STEP_COST.md).
ROWS_PER_LOOKUP = 8
#: ... and at most this many elements (fp32: 512 MiB for the table, as much for its gradient, both freed by the step).
MAX_TABLE_ELEMENTS = 1 << 27


def full_table_fits(n_rows: int, width: int) -> bool:
    """Whether a table of ``n_rows`` rows of ``width`` columns is one to build whole (``MAX_TABLE_ELEMENTS``)."""
    return 0 < n_rows * width <= MAX_TABLE_ELEMENTS


def full_table_pays(n_rows: int, width: int, n_lookups: int) -> bool:
    """Whether ``n_lookups`` ids of a table of ``n_rows`` rows of ``width`` columns are cheaper looked up in the whole table."""
    return n_rows <= ROWS_PER_LOOKUP * n_lookups and full_table_fits(n_rows, width)


def full_table(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``(N_L·N_R, M_L·M_R)``: every row ``i`` = ``left[i // N_R] @ right[i % N_R]`` flattened, from one GEMM."""
    (n_left, m_left, rank), (n_right, _, m_right) = left.shape, right.shape
    product = left.reshape(n_left * m_left, rank) @ right.transpose(0, 1).reshape(rank, n_right * m_right)
    return product.view(n_left, m_left, n_right, m_right).transpose(1, 2).reshape(n_left * n_right, m_left * m_right)


def full_table_rows(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``(len(ids), M_L·M_R)``: the ids' rows of :func:`full_table`, in the factors' dtype."""
    return F.embedding(ids, full_table(left, right)).to(left.dtype)


def full_table_bags(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor,
                    weights: torch.Tensor | None = None, *, mean: bool = False) -> torch.Tensor:
    """``(len(lengths), M_L·M_R)``: bag ``b`` pools (sum or mean, optionally weighted) its ``lengths[b]`` ids' rows."""
    rows = full_table_rows(left, right, ids)
    return pool_bags(rows, torch.arange(ids.numel(), device=ids.device), lengths, weights, mean=mean)
