"""TTEmbedding: an embedding table stored as a tensor-train matrix (docs/METHOD.md §1.2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from comera_lightning.layers.base import TTModule
from comera_lightning.layers.contraction import chain_cost, contract_chain, tt_svd
from comera_lightning.layers.hot_rows import HotRowIndex, IdCounter, default_cache_rows, hottest
from comera_lightning.layers.inference_cache import caching_allowed
from comera_lightning.layers.interface import LayerSummary, format_modes
from comera_lightning.layers.kernels import fused_kernels_apply, two_factor_bags, two_factor_rows, whole_table_applies
from comera_lightning.layers.shapes import bond_rank_caps, cheapest, is_two_factor_table, prod, table_modes
from comera_lightning.layers.table_serving import TableServing
from comera_lightning.layers.tt_rows import (chain_cost_per_id, chain_rows, check_ids, grouped_chain_rows, grouped_cost_per_id,
                                             ids_are_checkable)

__all__ = ["LOOKUPS", "TTEmbedding"]

#: How rows are contracted: ``"auto"`` picks the cheaper of the other two for each call.
LOOKUPS = ("auto", "tables", "chain")


class TTEmbedding(TTModule):
    """Like ``nn.Embedding``; row ``i`` of the table is a product of TT-matrix core slices.

    Cores are ``(r_{k-1}, n_k, m_k, r_k)`` with row modes ``n`` (``∏n ≥ num_embeddings``, padded
    when the vocabulary factorises badly) and column modes ``m`` (``∏m ≥ embedding_dim``).
    ``num_cores=1`` is the table as two factors (rows × rank, rank × dim), as for ``TTLinear``: from a
    trained table, its truncated SVD.
    Two lookups (``lookup="auto"`` takes the one with fewer multiply-adds for each call):

    * ``"tables"``: the cores left and right of a split bond are contracted into two small tables
      for all of their row sub-indices (once per call, or once at inference), then each id gathers
      one slice from each and one batched matmul finishes the rows;
    * ``"chain"``: each id's row is the product of its slices of every core (``tt_rows.py``; in
      eager mode the ids are grouped by each middle core's digit, one larger product per slice):
      nothing per call, more per id; the cheaper one when a batch touches few rows of a big table.

    On CUDA with Triton installed, two cores (either lookup), or a longer train's half tables, run as one fused
    kernel or through the whole table (``kernels/``), forward and backward; CPU keeps the torch path.

    With ``deduplicate`` (eager mode) each distinct id is contracted once and its gradient accumulated once; the sort
    this needs costs more than it saves for text-like batches on CPU, so it is off by default here and on in
    ``TTEmbeddingBagCollection``.

    **Hot rows.** Training-mode forwards count the ids (bounded memory, ``hot_rows.py``); in eval
    mode without autograd the ``cache_rows`` most frequent rows are materialised from the cores
    and served by a gather, only the misses are contracted (through the half tables:
    ``table_serving.py``). The rows are rebuilt whenever a core, gate or mask changes, so they are
    exact. ``cache_rows=None`` keeps 4 MiB of rows (the whole table when smaller), ``0`` turns the
    cache off; ``count_ids`` counts ids without training.
    """

    vocabulary_layer = True

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        max_rank: int | Sequence[int],
        padding_idx: int | None = None,
        row_modes: Sequence[int] | None = None,
        col_modes: Sequence[int] | None = None,
        num_cores: int = 4,
        deduplicate: bool = False,
        cache_rows: int | None = None,
        lookup: str = "auto",
        gate_threshold: float = 1e-2,
        init_std: float = 1.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        for name, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim), ("num_cores", num_cores)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx={padding_idx} is outside the table of {num_embeddings} rows.")
            padding_idx %= num_embeddings
        row_modes, col_modes = table_modes(num_embeddings, embedding_dim, num_cores, row_modes, col_modes)
        sizes = [n * m for n, m in zip(row_modes, col_modes)]
        super().__init__(
            list(zip(row_modes, col_modes)), bond_rank_caps(sizes, max_rank),
            gate_threshold=gate_threshold, std=init_std, device=device, dtype=dtype,
        )
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.deduplicate = padding_idx, deduplicate
        self.row_modes, self.col_modes = row_modes, col_modes
        if lookup not in LOOKUPS:
            raise ValueError(f"lookup={lookup!r} is not one of {LOOKUPS}.")
        if cache_rows is not None and (isinstance(cache_rows, bool) or not isinstance(cache_rows, int) or cache_rows < 0):
            raise ValueError(f"cache_rows must be None (automatic), 0 (no cache) or a positive number of rows, got {cache_rows!r}.")
        self.lookup_mode = lookup
        element_size = self.cores[0].element_size()
        self.cache_rows = default_cache_rows(num_embeddings, embedding_dim, element_size) if cache_rows is None else min(cache_rows, num_embeddings)
        capacity = 0 if self.caches_whole_table else 2 * self.cache_rows
        self.id_counter = IdCounter(capacity)
        id_dtype = torch.int32 if num_embeddings <= torch.iinfo(torch.int32).max else torch.long  # int32: a third less memory
        self.register_buffer("counted_ids", torch.full((capacity,), -1, dtype=id_dtype, device=device))
        self.register_buffer("id_counts", torch.zeros(capacity, dtype=torch.int32, device=device))

    def token_cores(self) -> list[int]:
        """Every core (each holds a factor of many tokens' rows), except in the two-factor table: there a token owns
        its row of the first factor, as of a dense table, and the second is shared by every token (stretching its
        step would move every row at once), so neither is stretched."""
        return [] if is_two_factor_table(self.row_modes, self.col_modes) else super().token_cores()

    # ------------------------------------------------------------------ conversions
    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, *, max_rank: int | Sequence[int], **kwargs) -> "TTEmbedding":
        """TT-SVD of the table: exact at full rank, the best TT-matrix approximation below."""
        if not isinstance(embedding, nn.Embedding):
            raise TypeError(f"from_embedding expects an nn.Embedding, got {type(embedding).__name__}.")
        if embedding.max_norm is not None or embedding.sparse:
            raise ValueError("from_embedding does not support max_norm or sparse=True embeddings.")
        w = embedding.weight
        kwargs.setdefault("padding_idx", embedding.padding_idx)
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, max_rank=max_rank, device=w.device, dtype=w.dtype, **kwargs)
        layer.load_table_(w)
        return layer

    @torch.no_grad()
    def load_table_(self, table: torch.Tensor) -> None:
        """Set the cores to the TT-SVD of a ``(num_embeddings, embedding_dim)`` table."""
        d = len(self.row_modes)
        padded = table.new_zeros(prod(self.row_modes), prod(self.col_modes))
        padded[: self.num_embeddings, : self.embedding_dim] = table
        # (n1..nd, m1..md) -> (n1, m1, n2, m2, ...) -> (n1·m1, n2·m2, ...)
        interleaved = padded.reshape(*self.row_modes, *self.col_modes).permute(*[i for k in range(d) for i in (k, d + k)])
        merged = interleaved.reshape([n * m for n, m in zip(self.row_modes, self.col_modes)])
        self.load_cores_(tt_svd(merged, self.physical_ranks))

    def weight_table(self) -> torch.Tensor:
        """The dense ``(num_embeddings, embedding_dim)`` table the train represents."""
        d = len(self.row_modes)
        full = contract_chain([c.flatten(1, 2) for c in self.gated_cores()])
        full = full.reshape([s for pair in zip(self.row_modes, self.col_modes) for s in pair])
        full = full.permute(*range(0, 2 * d, 2), *range(1, 2 * d, 2)).reshape(prod(self.row_modes), prod(self.col_modes))
        table = full[: self.num_embeddings, : self.embedding_dim]
        if self.padding_idx is not None:
            table = table.clone()
            table[self.padding_idx] = 0
        return table

    def to_dense_module(self) -> nn.Embedding:
        """The dense module this layer replaces (used by ``to_dense``)."""
        return self.to_embedding()

    def to_embedding(self) -> nn.Embedding:
        """An ``nn.Embedding`` holding the same table."""
        table = self.weight_table().detach()
        embedding = nn.Embedding(self.num_embeddings, self.embedding_dim, padding_idx=self.padding_idx, device=table.device, dtype=table.dtype)
        with torch.no_grad():
            embedding.weight.copy_(table)
        return embedding

    def dense_parameters(self) -> int:
        """Parameters of the equivalent ``nn.Embedding``."""
        return self.num_embeddings * self.embedding_dim

    def summary(self) -> LayerSummary:
        """``embedding``, (rows, dim), row×column modes, stored ranks."""
        modes = format_modes(self.row_modes, self.col_modes, "×")
        return LayerSummary("embedding", (self.num_embeddings, self.embedding_dim), modes, self.physical_ranks)

    # ------------------------------------------------------------------ lookup
    def half_tables(self, split: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left table ``(N_L, M_L, r)`` and right table ``(N_R, r, M_R)`` for a cut after core ``split-1``."""
        cores = self.gated_cores()
        k_left, k_right = split, len(cores) - split
        left = contract_chain([c.flatten(1, 2) for c in cores[:split]])  # (1, n1 m1 n2 m2 .., r)
        left = left.reshape(*[s for c in cores[:split] for s in c.shape[1:3]], -1)
        left = left.permute(*range(0, 2 * k_left, 2), *range(1, 2 * k_left, 2), 2 * k_left)
        rank = left.shape[-1]
        left = left.reshape(prod(self.row_modes[:split]), prod(self.col_modes[:split]), rank)
        right = contract_chain([c.flatten(1, 2) for c in cores[split:]])  # (r, n m .., 1)
        right = right.reshape(rank, *[s for c in cores[split:] for s in c.shape[1:3]])
        right = right.permute(*range(1, 2 * k_right + 1, 2), 0, *range(2, 2 * k_right + 1, 2))
        right = right.reshape(prod(self.row_modes[split:]), rank, prod(self.col_modes[split:]))
        return left, right

    def best_split(self, num_ids: int) -> int:
        """The cut with the fewest multiply-adds for ``num_ids`` lookups (tables + batched matmul)."""
        sizes = [n * m for n, m in zip(self.row_modes, self.col_modes)]
        bonds = [1, *self.physical_ranks, 1]

        def cost(s: int) -> int:
            tables = chain_cost(bonds[: s + 1], sizes[:s]) + chain_cost(bonds[s:], sizes[s:])
            return tables + num_ids * prod(self.col_modes[:s]) * bonds[s] * prod(self.col_modes[s:])

        return cheapest(range(1, len(self.cores)), lambda s: (cost(s), abs(2 * s - len(self.cores))))

    def uses_chain(self, num_ids: int, split: int) -> bool:
        """Whether ``num_ids`` lookups now take the per-id chain rather than the half tables cut at ``split``."""
        if self.lookup_mode != "auto":
            return self.lookup_mode == "chain"
        bonds = [1, *self.physical_ranks, 1]
        tables = num_ids * prod(self.col_modes[:split]) * bonds[split] * prod(self.col_modes[split:])
        if not caching_allowed(self.training):  # built on every call; at inference once
            sizes = [n * m for n, m in zip(self.row_modes, self.col_modes)]
            tables += chain_cost(bonds[: split + 1], sizes[:split]) + chain_cost(bonds[split:], sizes[split:])
        shapes = [tuple(c.shape) for c in self.cores]
        per_id = grouped_cost_per_id(shapes) if ids_are_checkable() else chain_cost_per_id(shapes)  # (the chain lookup's choice)
        return num_ids * per_id < tables

    def _fused_split(self, num_ids: int) -> int | None:
        """The cut whose half tables ``kernels/`` multiplies for ``num_ids`` lookups (kernel or whole table), or None (torch
        path): two cores are their own half tables; a longer train's where they are the cheaper lookup or whole."""
        whole = whole_table_applies(self.cores[0], prod(self.row_modes), prod(self.col_modes), num_ids)
        if not (whole or fused_kernels_apply(self.cores[0])):
            return None
        split = self.best_split(num_ids)
        return split if whole or len(self.cores) == 2 or not self.uses_chain(num_ids, split) else None

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows for a 1-D tensor of ids, ``(len(ids), embedding_dim)``, contracted from the cores (no hot rows)."""
        if 0 in self.physical_ranks:
            return self.dead_output((ids.numel(), self.embedding_dim), self.cores[0].new_zeros(()))  # ids carry no gradient
        fused = (split := self._fused_split(ids.numel())) is not None
        if not fused:
            split = self.best_split(ids.numel())  # (the tables' cost keeps them small, also when cached)
            if self.uses_chain(ids.numel(), split):
                if ids_are_checkable() and ids.numel():  # eager: by digit groups (the groups' sizes need a host sync)
                    return grouped_chain_rows(list(self.cores), self.bond_scales(), self.row_modes, ids)[:, : self.embedding_dim]
                return chain_rows(self.gated_cores(), self.row_modes, ids)[:, : self.embedding_dim]
        left, right = self.cached(("half_tables", split), lambda: self.half_tables(split))
        # the torch path's gathered halves are recomputed in backward; the kernel and whole table save no more than the halves
        recompute = not fused and torch.is_grad_enabled() and (left.requires_grad or right.requires_grad)
        rows = checkpoint(two_factor_rows, left, right, ids, use_reentrant=False) if recompute else two_factor_rows(left, right, ids)
        return rows[:, : self.embedding_dim]

    def fused_bags(self, ids: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None, *,
                   mean: bool = False) -> torch.Tensor | None:
        """``(len(lengths), embedding_dim)`` bags of 1-D ``ids`` pooled by the fused kernel where it runs, else None."""
        split = self._fused_split(ids.numel()) if ids.numel() and 0 not in self.physical_ranks else None
        if split is None:
            return None
        self._count_training_ids(ids)
        return two_factor_bags(*self.half_tables(split), ids, lengths, weights, mean=mean)[:, : self.embedding_dim]

    # ------------------------------------------------------------------ hot rows
    @property
    def caches_whole_table(self) -> bool:
        """Whether the hot-row cache holds every row (then nothing needs counting)."""
        return self.cache_rows >= self.num_embeddings

    def count_ids(self, ids: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Count ``ids`` towards the hot rows (training forwards do; call it to count from data without training)."""
        if self.id_counter.update(ids, counts):
            self.id_counter.merge_into(self.counted_ids, self.id_counts)
        cache = self.__dict__.get("_inference_cache")
        if cache is not None:  # the hottest ids may have changed
            cache.discard("serving")

    def has_counts(self) -> bool:
        """Whether any id was counted (syncs with the device)."""
        return self.id_counter.pending() or bool((self.counted_ids >= 0).any())

    def hot_ids(self) -> torch.Tensor:
        """The ids to serve from the cache at inference, most frequent first (every id when the cache holds the table)."""
        if self.caches_whole_table:
            return torch.arange(self.num_embeddings, device=self.cores[0].device)
        self.id_counter.merge_into(self.counted_ids, self.id_counts)
        return hottest(self.counted_ids, self.id_counts, self.cache_rows)

    def build_hot_rows(self) -> tuple[HotRowIndex | None, torch.Tensor]:
        """``(index, rows)`` of the hot rows, contracted from the current cores now.

        ``index`` is None when the cache holds the whole table (row ``i`` is then ``rows[i]``).
        """
        if self.caches_whole_table:
            return None, self.lookup(self.hot_ids())
        index = HotRowIndex(self.hot_ids(), self.cache_rows)
        return index, self.lookup(index.ids)

    def serving(self) -> TableServing:
        """The hot rows, hash index and half tables served from at inference (``table_serving.py``); cached until a
        core, gate or mask changes, or ids are counted."""
        return self.cached("serving", lambda: TableServing(self))

    def inference_bytes(self) -> int:
        """Bytes held for serving: parameters, buffers, and what the inference cache holds now."""
        total = sum(t.numel() * t.element_size() for t in (*self.parameters(), *self.buffers()))
        cache = self.__dict__.get("_inference_cache")
        for value in cache.values.values() if cache is not None else ():
            for part in value if isinstance(value, tuple) else (value,):  # half tables, or the serving state
                total += part.numel() * part.element_size() if isinstance(part, torch.Tensor) else part.nbytes()
        return total

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.id_counter.merge_into(self.counted_ids, self.id_counts)  # the saved counts include the pending ones
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        """Counts saved with any cache size load into this one (the most frequent that fit); none saved: start afresh."""
        stored_ids, stored_counts = state_dict.pop(prefix + "counted_ids", None), state_dict.pop(prefix + "id_counts", None)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        for name in ("counted_ids", "id_counts"):
            if prefix + name in missing_keys:
                missing_keys.remove(prefix + name)
        self.id_counter = IdCounter(self.counted_ids.numel())
        self.counted_ids.fill_(-1)
        self.id_counts.zero_()
        if stored_ids is not None and stored_counts is not None:
            kept = stored_ids >= 0
            self.id_counter.update(stored_ids[kept].to(self.counted_ids.device), stored_counts[kept].to(self.counted_ids.device))
            self.id_counter.merge_into(self.counted_ids, self.id_counts)

    # ------------------------------------------------------------------ forward
    def serves_hot_rows(self) -> bool:
        """Whether a lookup now is answered from the hot rows (eval mode, no autograd, cache on)."""
        return bool(self.cache_rows) and caching_allowed(self.training)

    def rows(self, flat: torch.Tensor) -> torch.Tensor:
        """Rows of 1-D ids: from the hot rows at inference, else contracted (each distinct id once with ``deduplicate``)."""
        if self.serves_hot_rows() and 0 not in self.physical_ranks:
            return self.serving().rows(flat)
        if self.deduplicate and ids_are_checkable() and flat.numel() > 1:
            unique, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
            self._count_training_ids(unique, counts)
            return self.lookup(unique)[inverse]
        self._count_training_ids(flat)
        return self.lookup(flat)

    def _count_training_ids(self, ids: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Count a training forward's ids (eager only: merging counts needs host syncs; compiled training counts none)."""
        if self.training and self.id_counter.capacity and ids_are_checkable():
            self.count_ids(ids, counts)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_ids(ids, self.num_embeddings)
        flat = ids.reshape(-1).long()
        rows = self.rows(flat)
        if self.padding_idx is not None:
            rows = rows * (flat != self.padding_idx).unsqueeze(1).to(rows.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}, "
            f"rows={'·'.join(map(str, self.row_modes))}, cols={'·'.join(map(str, self.col_modes))}, "
            f"ranks={list(self.physical_ranks)}, compression={self.compression_ratio():.1f}x, cache_rows={self.cache_rows}"
        )
