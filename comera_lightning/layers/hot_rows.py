"""Serving a table's most frequent rows from a materialised cache (TT-Rec's hot-row cache, kept exact).

Click logs and text are skewed: a few thousand ids make most lookups. :class:`IdCounter` counts
the ids a table sees in training (or is shown with ``count_ids``) in bounded memory;
:class:`HotRowIndex` finds a hot id's row by hashing; ``table_serving.py`` (one table) and
``bag_serving.py`` (a collection) answer lookups from the hot rows and contract only the misses
(``miss_rows.py``). The rows are computed from the current cores and kept in the layer's
inference cache (``inference_cache.py``), so they are never stale: any change to a core, gate or
mask (an optimizer step, a prune, a load) rebuilds them.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DEFAULT_CACHE_BYTES", "HotRowIndex", "hash_slot", "hottest", "IdCounter", "SLOTS_PER_ROW", "default_cache_rows", "keep_id_counts_local"]

#: Bytes of materialised rows a table keeps for serving by default (65,536 rows at dim 16 in fp32).
DEFAULT_CACHE_BYTES = 4 * 2**20
#: Hash slots per cached row (load 1/2): the hottest ids win their slots (tests/layers/test_hot_rows.py measures the loss).
SLOTS_PER_ROW = 2
_HASH_MULTIPLIER = 0x9E3779B97F4A7C15 - 2**64  # Knuth's golden-ratio constant as a signed int64


def default_cache_rows(num_embeddings: int, embedding_dim: int, element_size: int) -> int:
    """Rows that fit ``DEFAULT_CACHE_BYTES`` (at most the whole table)."""
    return min(num_embeddings, max(1, DEFAULT_CACHE_BYTES // (embedding_dim * element_size)))


class IdCounter:
    """Approximate counts of the ids seen most often, kept in two fixed-size tensors the layer owns.

    ``ids`` (int32 below 2^31 rows, else int64; -1 where empty) and ``counts`` (int32: ``.half()``
    leaves them alone) have ``capacity`` entries; they are the layer's buffers, saved, loaded and
    moved with it (``tensorize`` keeps them out of DDP's broadcasts: :func:`keep_id_counts_local`).
    Batches are kept pending and merged in bulk; when more distinct ids are known than fit, the
    least frequent are dropped (lossy counting: an id frequent enough to be among the hottest
    keeps coming back and survives, a rare one is forgotten).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._pending_size = 0

    def update(self, ids: torch.Tensor, counts: torch.Tensor | None = None) -> bool:
        """Count ``ids`` (``counts`` times each when given); True when enough is pending to :meth:`merge_into`."""
        if self.capacity <= 0 or not ids.numel():
            return False
        ids = ids.detach().reshape(-1).long()
        counts = torch.ones(ids.shape, dtype=torch.long, device=ids.device) if counts is None else counts.detach().reshape(-1).long()
        self._pending.append((ids, counts))
        self._pending_size += ids.numel()
        return self._pending_size >= self.capacity

    @torch.no_grad()
    def merge_into(self, ids: torch.Tensor, counts: torch.Tensor) -> None:
        """Add the pending counts to ``ids``/``counts`` in place, keeping the ``capacity`` most frequent."""
        if not self._pending:
            return
        all_ids = torch.cat([ids, *[p[0].to(ids.device) for p in self._pending]])
        all_counts = torch.cat([counts.long(), *[p[1].to(counts.device) for p in self._pending]])
        self._pending, self._pending_size = [], 0
        unique, inverse = torch.unique(all_ids, return_inverse=True)
        summed = torch.zeros(unique.shape, dtype=torch.long, device=ids.device).index_add_(0, inverse, all_counts)
        summed[unique < 0] = 0  # the empty entries
        keep = summed.topk(min(self.capacity, unique.numel())).indices
        ids.fill_(-1)
        counts.zero_()
        kept = summed[keep] > 0
        ids[: keep.numel()] = torch.where(kept, unique[keep], -1)
        counts[: keep.numel()] = summed[keep].clamp(max=torch.iinfo(counts.dtype).max)

    def pending(self) -> bool:
        """Whether counts wait to be merged."""
        return bool(self._pending)


def hottest(ids: torch.Tensor, counts: torch.Tensor, k: int) -> torch.Tensor:
    """The (at most) ``k`` most frequent ids of merged counts, most frequent first."""
    order = counts.topk(min(k, counts.numel())).indices
    top = ids[order].long()  # int64 like every id a lookup hashes (an int32 product would wrap differently)
    return top[top >= 0]


def hash_slot(ids: torch.Tensor, mask: int) -> torch.Tensor:
    """The hash-table slot of each id (``mask + 1`` slots, a power of two): a multiplicative hash."""
    return ((ids * _HASH_MULTIPLIER) >> 16) & mask  # int64 multiplication wraps around


class HotRowIndex:
    """Where each hot id's row is: a direct-mapped hash table, ``SLOTS_PER_ROW`` slots per cached row.

    A lookup is a hash, one gather and one compare per id (a binary search over 65,536 sorted ids
    cost 10x more on CPU). Hot ids whose slot a more frequent id took are left out (a few per cent
    of the least frequent ones at load 1/2); a left-out id is a miss, served exactly all the same.
    """

    def __init__(self, ids: torch.Tensor, rows: int) -> None:
        """``ids``: candidate hot ids, most frequent first; at most ``rows`` of them are kept."""
        ids = ids[:rows]
        size = 1 << max(1, (SLOTS_PER_ROW * max(rows, 1) - 1).bit_length())
        self.mask = size - 1
        slots = self._slot(ids)
        order = torch.sort(slots, stable=True).indices  # stable: the most frequent id comes first within a slot
        ordered = slots[order]
        first = torch.ones_like(ordered, dtype=torch.bool)
        first[1:] = ordered[1:] != ordered[:-1]
        keep = order[first].sort().values  # back in frequency order
        self.ids = ids[keep]  # the cached ids; row k of the cache is the row of ids[k]
        small = not ids.numel() or int(ids.max()) < 2**31  # int32 tags halve the index
        self.tags = torch.full((size,), -1, dtype=torch.int32 if small else torch.long, device=ids.device)
        self.position = torch.zeros(size, dtype=torch.int32, device=ids.device)
        self.tags[slots[keep]] = self.ids.to(self.tags.dtype)
        self.position[slots[keep]] = torch.arange(keep.numel(), dtype=torch.int32, device=ids.device)

    def _slot(self, ids: torch.Tensor) -> torch.Tensor:
        return hash_slot(ids, self.mask)

    def find(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(position, hit)``: the cache row of each id (int32; 0 where not cached), and whether it is cached."""
        slot = self._slot(ids)  # (index_select: much faster than advanced indexing on CPU)
        return self.position.index_select(0, slot), self.tags.index_select(0, slot) == ids

    def nbytes(self) -> int:
        """Bytes of the hash table (the ``ids`` list is only needed to build the rows)."""
        return sum(t.numel() * t.element_size() for t in (self.tags, self.position))


def keep_id_counts_local(model: nn.Module) -> None:
    """Tell DDP not to broadcast the TT tables' id counts from rank 0 at every forward.

    The counts only choose which rows each rank caches for serving (the rows themselves come from
    the synchronised cores, so every rank serves the same values); broadcasting them would cost
    ~1.5 MB per large table per step. DDP reads this attribute of the module it wraps
    (``tensorize`` sets it on the model it tensorizes).
    """
    names = [f"{name}.{buffer}" for name, module in model.named_modules() if "counted_ids" in module._buffers
             for buffer in ("counted_ids", "id_counts")]
    if names:
        ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
        model._ddp_params_and_buffers_to_ignore = sorted(ignored | set(names))
