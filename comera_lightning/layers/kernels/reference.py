"""The torch path of the two-factor lookup: the reference the Triton kernels are tested against, and their fallback.

A table of ``N_L·N_R`` rows of width ``M_L·M_R`` held as two factors, ``left`` ``(N_L, M_L, r)`` and ``right``
``(N_R, r, M_R)``: row ``i`` is ``left[i // N_R] @ right[i % N_R]`` flattened. A two-core TT-matrix's cores are such
factors as they are (the gather of core slices and the chain contraction in one); a longer train's two half tables
(``TTEmbedding.half_tables``) are too.
"""

from __future__ import annotations

import torch

from comera_lightning.layers.bag_pooling import pool_bags
from comera_lightning.layers.miss_rows import half_table_rows

__all__ = ["bags_reference", "rows_reference"]


def rows_reference(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``(len(ids), M_L·M_R)``: each id's row, one gather per factor and one batched matmul (``miss_rows.half_table_rows``)."""
    n_right = right.shape[0]
    return half_table_rows(left, right, ids // n_right, ids % n_right, False, left.shape[1] * right.shape[2])


def bags_reference(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor,
                   weights: torch.Tensor | None = None, *, mean: bool = False) -> torch.Tensor:
    """``(len(lengths), M_L·M_R)``: bag ``b`` pools (sum or mean, optionally weighted) the rows of its ``lengths[b]`` ids."""
    rows = rows_reference(left, right, ids)
    return pool_bags(rows, torch.arange(ids.numel(), device=ids.device), lengths, weights, mean=mean)
