"""Serving a whole ``TTEmbeddingBagCollection`` at once: one hot-row cache for all its tables.

At inference, looking tables up one by one costs a dozen small ops per table (26 tables for
Criteo), more than the lookups themselves. :class:`CollectionCache` keeps the rows of every
table that are served without contraction in one array: a small table (dense, or a TT table no
larger than its cache) whole, a large TT table's most frequent rows. A batch is then a fixed
number of ops whatever the number of tables: one hash lookup for the ids of large tables, one
contraction for all their misses (through the tables' half tables stacked into one), one
``embedding_bag`` over all features. The rows are computed from the current cores and rebuilt
when any core, gate, mask or dense weight changes (the key of ``inference_cache.py``): never stale.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning.layers.hot_rows import HotRowIndex
from comera_lightning.layers.inference_cache import InferenceCache
from comera_lightning.layers.miss_rows import SPARE_ROWS, ServedRows, StackedHalfTables, block_offsets
from comera_lightning.layers.tt_embedding import TTEmbedding

__all__ = ["CollectionCache"]


def _state_tensors(tables: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Every tensor the cached rows depend on: a TT table's cores, gates and masks, a dense table's weight."""
    return [t for table in tables for t in (table.state_tensors() if isinstance(table, TTEmbedding) else [table.weight])]


def _thresholds(tables: Sequence[nn.Module]) -> tuple:
    """The TT tables' gate thresholds (a changed threshold changes which gates count as dead)."""
    return tuple(t.gate_threshold for t in tables if isinstance(t, TTEmbedding))


class CollectionCache:
    """Rows of every table of a collection, served in a fixed number of ops (see the module docstring).

    Not thread-safe: a batch's misses are written into spare rows of the shared array (serve one
    module per thread).
    """

    def __init__(self, tables: Sequence[nn.Module], configs: Sequence, feature_names: Sequence[Sequence[str]]) -> None:
        self.tables = list(tables)
        self.features = [f for names in feature_names for f in names]
        table_of_feature = [t for t, names in enumerate(feature_names) for _ in names]
        self.partial = [t for t, table in enumerate(self.tables) if isinstance(table, TTEmbedding) and not table.caches_whole_table]
        first = _state_tensors(self.tables[:1])[0]
        device, self.dtype, self.dim = first.device, first.dtype, self.tables[0].embedding_dim
        self.partial_tensor = torch.tensor(self.partial, dtype=torch.long, device=device)
        with torch.no_grad():
            whole = [self._whole_rows(table) for table in self.tables]
            sizes = [len(w) if w is not None else 0 for w in whole]
            self.cached_rows = sum(sizes)
            partial_tables = [self.tables[t] for t in self.partial]
            self.stacked = StackedHalfTables(partial_tables) if StackedHalfTables.fits(partial_tables) else None
            self.key_base = block_offsets([c.num_embeddings for c in configs], device)
            parts = [w for w in whole if w is not None] + [self._build_hot()]
            self.served = ServedRows(torch.cat(parts))  # spare rows for misses are added by the first batch that needs them
        for table in partial_tables:
            table.clear_inference_cache()  # their half tables live in self.stacked now
        self.table_of_feature = table_of_feature
        self.feature_start = block_offsets(sizes, device)[table_of_feature]
        self.feature_size = torch.tensor([configs[t].num_embeddings for t in table_of_feature], device=device)
        self.mean = [configs[t].pooling.name == "MEAN" for t in table_of_feature]
        partial_features = [f for f, t in enumerate(table_of_feature) if t in self.partial]
        self.partial_features = torch.tensor(partial_features, dtype=torch.long, device=device)
        self.partial_key_base = self.key_base[[table_of_feature[f] for f in partial_features]].unsqueeze(1)
        self.state = InferenceCache.of(_state_tensors(self.tables), _thresholds(self.tables))

    def _no_rows(self) -> torch.Tensor:
        return torch.zeros(0, self.dim, dtype=self.dtype, device=self.partial_tensor.device)

    @staticmethod
    def _whole_rows(table: nn.Module) -> torch.Tensor | None:
        """Every row of a small table (dense, or TT no larger than its cache); None for a large TT table."""
        if not isinstance(table, TTEmbedding):
            return table.weight.detach()
        if not table.caches_whole_table:
            return None
        rows = table.build_hot_rows()[1]
        table.clear_inference_cache()
        return rows

    def _build_hot(self) -> torch.Tensor:
        """Index the large tables' hot ids as keys ``key_base[t] + id`` (each table's hottest first) and contract their rows."""
        keys, ranks = [], []
        for t in self.partial:
            ids = self.tables[t].hot_ids()
            keys.append(ids + int(self.key_base[t]))
            ranks.append(torch.arange(ids.numel(), device=ids.device))
        if not keys:
            self.index = None
            return self._no_rows()
        keys, ranks = torch.cat(keys), torch.cat(ranks)
        self.index = HotRowIndex(keys[torch.sort(ranks, stable=True).indices], keys.numel())
        self.index.position += self.cached_rows  # positions point into self.served.rows, after the whole tables
        rows = self._contract(self.index.ids)
        self.index.ids = None  # not needed once the rows exist
        return rows

    def _contract(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of large-table ``keys`` (``key_base[t] + id``), contracted from the tables' cores."""
        if not keys.numel():
            return self._no_rows()
        table = torch.searchsorted(self.key_base, keys, right=True) - 1
        ids = keys - self.key_base.index_select(0, table)
        if self.stacked is not None:
            return self.stacked.rows(ids, torch.searchsorted(self.partial_tensor, table))
        out = None
        for t in torch.unique(table).tolist():  # tables that cannot be stacked: one by one
            at = (table == t).nonzero().squeeze(1)
            rows = self.tables[t].lookup(ids.index_select(0, at))
            out = rows.new_zeros(keys.numel(), rows.shape[1]) if out is None else out
            out[at] = rows
        return out

    @staticmethod
    def can_serve(tables: Sequence[nn.Module]) -> bool:
        """One dim and dtype for all tables, and every TT table with a cache."""
        kinds = {(t.embedding_dim, (t.cores[0] if isinstance(t, TTEmbedding) else t.weight).dtype) for t in tables}
        return len(kinds) == 1 and all(t.cache_rows for t in tables if isinstance(t, TTEmbedding))

    def valid_for(self, tables: Sequence[nn.Module]) -> bool:
        """Whether these are still the tables, in the state, the rows were built from."""
        same = len(tables) == len(self.tables) and all(a is b for a, b in zip(tables, self.tables))
        return same and self.state.matches(_state_tensors(tables), _thresholds(tables))

    def nbytes(self) -> int:
        """Bytes of the cached rows, the hash index and the stacked half tables."""
        extra = (self.index.nbytes() if self.index is not None else 0) + (self.stacked.nbytes() if self.stacked is not None else 0)
        return extra + self.served.nbytes()

    def serve(self, keys: Sequence[str], values: torch.Tensor, lengths: torch.Tensor, length_per_key: Sequence[int],
              batch: int) -> torch.Tensor | None:
        """Pooled ``(batch, Σ dims)`` for a KJT's parts; None when its features differ or an id is out of range."""
        if list(keys) != self.features or not values.numel() or values.is_floating_point() or lengths.numel() != batch * len(keys):
            return None  # (other features, or a variable batch per feature: the per-table path handles or names it)
        bag = length_per_key[0] // batch
        if bag and all(n == bag * batch for n in length_per_key) and self._all_equal(lengths, bag):
            return self._serve_grid(values.view(len(keys), batch * bag), batch, bag)  # (int32 ids stay int32 there)
        values = values.long()
        device = values.device
        per_key = torch.tensor(length_per_key, device=device)
        feature = torch.repeat_interleave(torch.arange(len(self.features), device=device), per_key, output_size=values.numel())
        largest = torch.full((len(self.features),), -1, dtype=torch.long, device=device).scatter_reduce_(0, feature, values, "amax")
        if bool(values.min() < 0) or bool((largest >= self.feature_size).any()):
            return None  # the per-table path names the bad id
        slot = values + self.feature_start.index_select(0, feature)
        if self.index is not None:
            self._find_hot(slot, values, length_per_key)
        offsets = torch.cat([lengths.new_zeros(1), lengths.long().cumsum(0)])
        out = F.embedding_bag(slot, self.served.rows, offsets, mode="sum", include_last_offset=True)
        if any(self.mean):
            averaged = torch.tensor(self.mean, device=out.device).repeat_interleave(batch).unsqueeze(1)
            out = torch.where(averaged, out / lengths.clamp(min=1).unsqueeze(1).to(out.dtype), out)
        return out.view(len(self.features), batch, -1).transpose(0, 1).reshape(batch, -1)

    @staticmethod
    def _all_equal(lengths: torch.Tensor, bag: int) -> bool:
        """Whether every bag holds ``bag`` ids (one ``aminmax`` pass: a sixth of ``(lengths == bag).all()``'s time)."""
        extent = torch.aminmax(lengths)
        return int(extent.min) == bag == int(extent.max)

    def _serve_grid(self, grid: torch.Tensor, batch: int, bag: int) -> torch.Tensor | None:
        """The common layout, every bag ``bag`` ids long: ``grid`` is ``(features, batch·bag)``, served in whole-row ops.

        Row numbers are int32 where they fit (``embedding_bag`` is 20 % faster on them) and pooled
        in batch-major order, so the output needs no transpose.
        """
        # (amax per row and one min, one host sync: aminmax along a dim is several times slower on CPU)
        if bool((grid.min() < 0) | (grid.amax(dim=1) >= self.feature_size).any()):
            return None  # the per-table path names the bad id
        narrow = torch.int32 if self.served.rows.shape[0] + grid.numel() + SPARE_ROWS <= torch.iinfo(torch.int32).max else torch.long
        slot = grid.to(narrow) + self.feature_start.to(narrow).unsqueeze(1)
        if self.index is not None and self.partial_features.numel():
            keys = (grid.index_select(0, self.partial_features) + self.partial_key_base).view(-1)
            position, hit = self.index.find(keys)
            slot.index_copy_(0, self.partial_features, position.to(narrow).view(-1, grid.shape[1]))
            if not bool(hit.all()):
                miss = (~hit).nonzero().squeeze(1)
                at = self.partial_features.index_select(0, miss // grid.shape[1]) * grid.shape[1] + miss % grid.shape[1]
                slot.view(-1).index_copy_(0, at, self.served.add_misses(keys.index_select(0, miss), keys.numel(), self._contract).to(narrow))
        features = len(self.features)
        order = slot.view(features, batch, bag).transpose(0, 1).reshape(-1, bag)
        # (embedding_bag even for bags of one: F.embedding's gather of 16-float rows is ~2x slower on CPU)
        out = F.embedding_bag(order, self.served.rows, mode="mean" if all(self.mean) else "sum").view(batch, features, -1)
        if any(self.mean) and not all(self.mean):
            out = out / torch.tensor([bag if m else 1 for m in self.mean], device=out.device).view(1, -1, 1).to(out.dtype)
        return out.reshape(batch, -1)

    def _find_hot(self, slot: torch.Tensor, values: torch.Tensor, length_per_key: Sequence[int]) -> None:
        """Point ``slot`` at the cached row of each large-table id; contract the distinct misses into the spare rows."""
        ends = torch.tensor(length_per_key).cumsum(0).tolist()
        spans = [(end - length, end, t) for end, length, t in zip(ends, length_per_key, self.table_of_feature) if t in self.partial and length]
        if not spans:
            return
        device = values.device
        at = torch.cat([torch.arange(begin, end, device=device) for begin, end, _ in spans])
        key_base = torch.tensor([int(self.key_base[t]) for _, _, t in spans], device=device)
        key_base = torch.repeat_interleave(key_base, torch.tensor([end - begin for begin, end, _ in spans], device=device), output_size=at.numel())
        keys = values.index_select(0, at) + key_base
        position, hit = self.index.find(keys)
        slot.index_copy_(0, at, position.long())  # (index_copy_: advanced-index assignment is several times slower on CPU)
        if bool(hit.all()):
            return
        miss = (~hit).nonzero().squeeze(1)
        slot.index_copy_(0, at.index_select(0, miss), self.served.add_misses(keys.index_select(0, miss), keys.numel(), self._contract))
