"""A plain ``TTEmbedding`` served at inference: its hottest rows cached, the misses through its half tables.

Built once per state of the cores (the layer keeps it in its inference cache, so any change to a
core, gate or mask rebuilds it). A batch is a hash lookup of every id (``hot_rows.HotRowIndex``),
one contraction of the misses into spare rows after the cached rows (deduplicated when most ids
miss: ``miss_rows.ServedRows``) and one gather of the whole batch. The cached rows are contracted
by the same half-table product as the misses (``miss_rows.StackedHalfTables``), so an id's row is
the same bits whether it is cached or not. A table no larger than its cache is served whole.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from comera_lightning.layers.hot_rows import HotRowIndex
from comera_lightning.layers.miss_rows import ServedRows, StackedHalfTables

__all__ = ["TableServing"]


class TableServing:
    """The serving state of one ``TTEmbedding`` (``table``): hot-row index, cached and spare rows, half tables.

    Not thread-safe: a batch's misses overwrite the previous batch's spare rows (serve one module per thread).
    """

    @torch.no_grad()
    def __init__(self, table) -> None:
        halves = StackedHalfTables([table])
        if table.caches_whole_table:
            self.index, self.halves = None, None
            self.served = ServedRows(halves.rows(torch.arange(table.num_embeddings, device=halves.left.device)))
            return
        hot = table.hot_ids()
        self.index, self.halves = HotRowIndex(hot, hot.numel()), halves
        self.served = ServedRows(halves.rows(self.index.ids))
        self.index.ids = None  # not needed once the rows exist

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of 1-D int64 ``ids`` (in range): hot ones gathered, the misses contracted first."""
        if self.index is None:
            return F.embedding(ids, self.served.rows)
        position, hit = self.index.find(ids)
        miss = (~hit).nonzero().squeeze(1)  # (one host sync: the misses' count decides the work)
        if miss.numel():
            spare = self.served.add_misses(ids.index_select(0, miss), ids.numel(), self.halves.rows)
            position.index_copy_(0, miss, spare.to(position.dtype))
        return F.embedding(position, self.served.rows)

    def cached_rows(self) -> int:
        """How many rows are served without contraction."""
        return self.served.cached

    def nbytes(self) -> int:
        """Bytes of the cached and spare rows, the hash index and the half tables."""
        index = self.index.nbytes() if self.index is not None else 0
        return index + self.served.nbytes() + (self.halves.nbytes() if self.halves is not None else 0)
