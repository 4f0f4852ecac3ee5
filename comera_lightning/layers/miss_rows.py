"""The rows a hot-row cache misses, contracted at inference through half tables into spare rows after the cached ones.

Shared by a plain ``TTEmbedding`` (``table_serving.py``) and a whole ``TTEmbeddingBagCollection``
(``bag_serving.py``). Row ``i`` of a TT table is ``left[i // N_R] @ right[i % N_R]`` for its two
half tables (``TTEmbedding.half_tables``): one gather from each and one small product per id, the
fewest operations per row once the tables exist (built once per state of the cores).
:class:`StackedHalfTables` stacks the half tables of several tables (ranks zero-padded) so that one
gather and one ``bmm`` serve all of them; :class:`ServedRows` keeps the cached rows and, after them,
the spare rows a batch's misses are contracted into, so the whole batch is then one gather.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["SCALAR_BMM_MACS", "SPARE_ROWS", "ServedRows", "StackedHalfTables", "block_offsets", "half_table_rows",
           "multiply_right_transposed"]

#: Rows added after the cached ones when a batch misses more than there is room for (kept for later batches).
SPARE_ROWS = 1024
#: Below this many multiply-adds per matrix torch's CPU ``bmm`` runs a scalar loop (~0.4 µs a product) instead of BLAS.
SCALAR_BMM_MACS = 400


def multiply_right_transposed(rows_left: int, rows_right: int, rank: int) -> bool:
    """Whether a ``(M_L × r)·(r × M_R)`` row product is faster with the right factor stored ``(M_R, r)``, transposed.

    Measured on CPU, one thread, a few thousand products with their gathers: 1.5–2.0× faster below
    ``SCALAR_BMM_MACS`` multiply-adds (torch's scalar ``bmm`` loop); above it (BLAS) 1.1–1.4× for
    ``M_L`` ≤ 4 and ``M_R`` ≤ 8 (dim-16 tables, issue #28), but slower for wider rows: 0.75–0.94× for
    ``M_R`` = 16 at rank 11–32, 0.80–0.83× for ``M_L`` = ``M_R`` = 8 at rank 32 (a dim-64 table,
    ``benchmarks.inference.table_speed``'s ``layouts``).
    """
    return rows_left * rows_right * rank < SCALAR_BMM_MACS or (rows_left <= 4 and rows_right <= 8)


def block_offsets(sizes: Sequence[int], device: torch.device) -> torch.Tensor:
    """Where each of consecutive blocks of ``sizes`` starts: ``[0, s0, s0+s1, ...]`` without the total."""
    return torch.tensor([0, *torch.tensor(list(sizes)).cumsum(0)[:-1].tolist()], device=device)


def half_table_rows(left: torch.Tensor, right: torch.Tensor, left_at: torch.Tensor, right_at: torch.Tensor, transposed: bool,
                    dim: int) -> torch.Tensor:
    """``left[left_at] @ right[right_at]`` per id (``right`` stored ``(N, M_R, r)`` when ``transposed``), the first ``dim`` columns.

    Plain ops (gathers and one ``bmm``): ``export``'s table form runs the same product, and so does the fused
    kernels' torch path (``kernels/reference.py``).
    """
    left_rows = F.embedding(left_at, left.flatten(1)).view(-1, *left.shape[1:])
    right_rows = F.embedding(right_at, right.flatten(1)).view(-1, *right.shape[1:])
    return torch.bmm(left_rows, right_rows.transpose(1, 2) if transposed else right_rows).flatten(1)[:, :dim]


class StackedHalfTables:
    """The half tables of TT tables (``TTEmbedding``s of one column layout) stacked, ranks zero-padded.

    The right tables are stored ``(ΣN_R, r, M_R)``, or ``(ΣN_R, M_R, r)`` and multiplied transposed
    where that is faster on CPU (:func:`multiply_right_transposed`).
    """

    def __init__(self, tables: Sequence) -> None:
        split = tables[0].best_split(1)
        halves = [table.half_tables(split) for table in tables]
        rank = max(left.shape[-1] for left, _ in halves)
        self.left = torch.cat([F.pad(left, (0, rank - left.shape[-1])) for left, _ in halves])  # (ΣN_L, M_L, r)
        self.transposed = multiply_right_transposed(self.left.shape[1], halves[0][1].shape[2], rank)
        rights = [F.pad(right, (0, 0, 0, rank - right.shape[1])) for _, right in halves]
        self.right = torch.cat([right.transpose(1, 2) if self.transposed else right for right in rights])
        device = self.left.device
        self.n_right = torch.tensor([right.shape[0] for _, right in halves], device=device)
        self.single_n_right = int(self.n_right[0]) if len(tables) == 1 else None  # (read once: no host sync per call)
        self.left_base = block_offsets([left.shape[0] for left, _ in halves], device)
        self.right_base = block_offsets(self.n_right.tolist(), device)
        self.dim = tables[0].embedding_dim

    @staticmethod
    def fits(tables: Sequence) -> bool:
        """Whether the tables' half tables can be stacked: same cores' column modes and the same split."""
        if not tables:
            return False
        first = tables[0]
        return all(t.col_modes == first.col_modes and len(t.cores) == len(first.cores) and t.best_split(1) == first.best_split(1) for t in tables)

    def rows(self, ids: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of ``ids``, each in the stacked table number ``table`` (None: one table): one ``(M_L × r)·(r × M_R)`` product per id."""
        if self.single_n_right is not None:
            left_at, right_at = ids // self.single_n_right, ids % self.single_n_right
        else:
            n_right = self.n_right.index_select(0, table)
            left_at = self.left_base.index_select(0, table) + ids // n_right
            right_at = self.right_base.index_select(0, table) + ids % n_right
        return half_table_rows(self.left, self.right, left_at, right_at, self.transposed, self.dim)

    def nbytes(self) -> int:
        return (self.left.numel() + self.right.numel()) * self.left.element_size()


class ServedRows:
    """The rows a lookup gathers from: ``cached`` rows first, then spare rows each batch's misses are contracted into.

    Not thread-safe: a batch's misses overwrite the previous batch's (serve one module per thread).
    """

    def __init__(self, cached: torch.Tensor) -> None:
        self.rows, self.cached = cached, cached.shape[0]

    def add_misses(self, keys: torch.Tensor, looked_up: int, contract: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Contract ``keys`` with ``contract`` into the spare rows; the row number of each key.

        Deduplicated when they are more than half of the ``looked_up`` ids (a cold or small cache:
        hot ids repeat among them). When the cache answers most ids the misses are its tail, 99 %
        distinct on Criteo-shaped Zipf ids: sorting them would cost more than the repeats.
        """
        missed, inverse = torch.unique(keys, return_inverse=True) if 2 * keys.numel() > looked_up else (keys, None)
        end = self.cached + missed.numel()
        if end > self.rows.shape[0]:  # more misses than spare rows: grow
            self.rows = torch.cat([self.rows, self.rows.new_zeros(end - self.rows.shape[0] + SPARE_ROWS, self.rows.shape[1])])
        self.rows[self.cached : end] = contract(missed)
        return self.cached + (inverse if inverse is not None else torch.arange(keys.numel(), device=keys.device))

    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()
