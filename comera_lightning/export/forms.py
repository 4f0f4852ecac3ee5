"""The plain-PyTorch inference forms a TT layer can take in an exported program (``choice.py`` picks one).

The forms hold only plain tensors and plain ops (``F.linear``, ``F.embedding``, ``bmm``), so an
exported program needs torch alone:

* ``CoresLinear``: a ``TTLinear``'s **cores** (dead ranks sliced out, gates folded in), contracted on
  every call into the two factors of the bond between input and output cores, applied as two matmuls;
* ``FactorsLinear``: those **two factors** stored contracted (``nn.Linear(in, r)`` then ``nn.Linear(r, out)``);
* ``FactorsEmbedding``: a two-factor ``TTEmbedding``'s factors (rows × rank, rank × dim), an id's row one gather and
  one small product, as a plain low-rank table serves it;
* ``CoresEmbedding``: a ``TTEmbedding``'s **cores**, plus **hot rows** when asked for: a hot id is a hash
  lookup and a gather, any other id the product of its core slices; or (``miss_tables``) its two **half
  tables** instead of the cores: a miss is then one product of their rows, as the eager layer serves it
  (``layers/miss_rows.py``): 2,048 instead of the chain's 43,008 multiply-adds for a 1M × 64 table at
  rank 32, for more bytes (2.3 MB of half tables there instead of 0.8 MB of cores);
* or the **dense** ``nn.Linear`` / ``nn.Embedding`` (``TTLinear.to_linear``, ``TTEmbedding.to_embedding``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning.layers import TTEmbedding, TTLinear
from comera_lightning.layers.contraction import contract_chain
from comera_lightning.layers.hot_rows import HotRowIndex, hash_slot
from comera_lightning.layers.miss_rows import StackedHalfTables, half_table_rows
from comera_lightning.layers.shapes import prod
from comera_lightning.layers.tt_rows import chain_rows

__all__ = ["CoresEmbedding", "CoresLinear", "FactorsEmbedding", "FactorsLinear", "factors_linear"]


class CoresLinear(nn.Module):
    """``y = (x A) B + bias`` with ``A``, ``B`` contracted from the stored cores on every call."""

    def __init__(self, layer: TTLinear) -> None:
        super().__init__()
        self.cores = nn.ParameterList(nn.Parameter(c.detach().clone(), requires_grad=False) for c in layer.gated_cores())
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
        self.split, self.in_features, self.out_features = len(layer.in_modes), layer.in_features, layer.out_features

    def _factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        cores = list(self.cores)
        left, right = contract_chain(cores[: self.split]), contract_chain(cores[self.split :])
        return left.reshape(-1, left.shape[-1])[: self.in_features], right.reshape(right.shape[0], -1)[:, : self.out_features]

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``(out, in)`` weight, for model code that reads a linear layer's weight (T5 reads its dtype)."""
        a, b = self._factors()
        return (a @ b).T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self._factors()
        y = (x @ a) @ b
        return y + self.bias if self.bias is not None else y


class FactorsLinear(nn.Sequential):
    """``nn.Linear(in, r)`` then ``nn.Linear(r, out)``; ``weight``/``bias`` answer code that reads a linear's (T5)."""

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``(out, in)`` weight the two factors stand for."""
        return self[1].weight @ self[0].weight

    @property
    def bias(self) -> torch.Tensor | None:
        """The output bias."""
        return self[1].bias


@torch.no_grad()
def factors_linear(layer: TTLinear) -> FactorsLinear:
    """The two factors of the bond between ``layer``'s input and output cores, contracted now."""
    split = len(layer.in_modes)
    rank = layer.physical_ranks[split - 1]
    left, right = layer.halves(split)
    a = left.reshape(prod(layer.in_modes), rank)[: layer.in_features]
    b = right.reshape(rank, prod(layer.out_modes))[:, : layer.out_features]
    first = nn.Linear(layer.in_features, rank, bias=False, device=a.device, dtype=a.dtype)
    second = nn.Linear(rank, layer.out_features, bias=layer.bias is not None, device=a.device, dtype=a.dtype)
    first.weight.copy_(a.T)
    second.weight.copy_(b.T)
    if layer.bias is not None:
        second.bias.copy_(layer.bias)
    return FactorsLinear(first, second)


class CoresEmbedding(nn.Module):
    """``nn.Embedding`` stored as its TT cores (or half tables) plus optional hot rows: a hot id is a gather, any other id a product.

    ``index``: the hot rows' hash index (``layers/hot_rows.py``), its rows contracted here by the same
    product as the misses (so an id's row is the same bits cached or not); None: no hot rows, every
    id is contracted. ``miss_tables``: store the half tables (``left``, ``right``) instead of the
    cores, and contract an id as one product of their rows (``layers/miss_rows.py``) instead of the
    chain of its core slices (``layers/tt_rows.py``).
    """

    def __init__(self, layer: TTEmbedding, index: HotRowIndex | None = None, miss_tables: bool = False) -> None:
        super().__init__()
        self.row_modes, self.embedding_dim, self.padding_idx = tuple(layer.row_modes), layer.embedding_dim, layer.padding_idx
        self.dead = 0 in layer.physical_ranks  # a bond pruned to rank 0: every row is zeros
        self.miss_tables = miss_tables and not self.dead
        cores = [] if self.miss_tables else [nn.Parameter(c.detach().clone(), requires_grad=False) for c in layer.gated_cores()]
        self.cores = nn.ParameterList(cores)
        if self.miss_tables:
            halves = StackedHalfTables([layer])
            self.register_buffer("left", halves.left)
            self.register_buffer("right", halves.right)
            self.n_right, self.transposed = halves.single_n_right, halves.transposed
        device = layer.cores[0].device
        self.register_buffer("tags", index.tags.clone() if index is not None else torch.empty(0, dtype=torch.long, device=device))
        self.register_buffer("position", index.position.clone() if index is not None else torch.empty(0, dtype=torch.int32, device=device))
        self.register_buffer("hot_rows", layer.cores[0].new_zeros(0, layer.embedding_dim))
        if index is not None:
            self.hot_rows = self._contract(index.ids).detach()
        self.mask = max(self.tags.numel() - 1, 0)

    @property
    def num_hot_rows(self) -> int:
        """Rows served from the cache."""
        return self.hot_rows.shape[0]

    def _contract(self, ids: torch.Tensor) -> torch.Tensor:
        if self.dead:
            return self.hot_rows.new_zeros(ids.numel(), self.embedding_dim)
        if self.miss_tables:
            return half_table_rows(self.left, self.right, ids // self.n_right, ids % self.n_right, self.transposed, self.embedding_dim)
        return chain_rows(list(self.cores), self.row_modes, ids)[:, : self.embedding_dim]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).long()  # (the hash needs int64: narrower ids would overflow)
        if not self.tags.numel():
            rows = self._contract(flat)
        else:
            # Not layers.table_serving: its "any misses?" host branch cannot be exported; here the
            # misses are a data-dependent index (empty or not) that torch.export keeps symbolic.
            slot = hash_slot(flat, self.mask)
            hit = self.tags.index_select(0, slot) == flat
            rows = F.embedding(self.position.index_select(0, slot).long(), self.hot_rows)
            miss = (~hit).nonzero().squeeze(1)
            rows = rows.index_copy(0, miss, self._contract(flat.index_select(0, miss)))
        if self.padding_idx is not None:
            rows = rows * (flat != self.padding_idx).unsqueeze(1).to(rows.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)


class FactorsEmbedding(nn.Module):
    """A two-factor ``TTEmbedding`` (``shapes.is_two_factor_table``) as its factors, gates folded in: ``left[ids] @ right``."""

    def __init__(self, layer: TTEmbedding) -> None:
        super().__init__()
        first, second = (c.detach() for c in layer.gated_cores())
        rank = first.shape[-1]
        self.left = nn.Parameter(first.reshape(-1, rank)[: layer.num_embeddings].clone(), requires_grad=False)
        self.right = nn.Parameter(second.reshape(rank, -1)[:, : layer.embedding_dim].clone(), requires_grad=False)
        self.padding_idx = layer.padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.left) @ self.right
        if self.padding_idx is not None:
            rows = rows * (ids != self.padding_idx).unsqueeze(-1).to(rows.dtype)
        return rows
