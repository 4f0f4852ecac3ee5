"""Each TT layer's cheapest plain-PyTorch inference form, for ``comera_lightning.export``.

The forms hold only plain tensors and plain ops (``F.linear``, ``F.embedding``, ``bmm``), so an
exported program needs torch alone:

* ``TTLinear`` / ``TTConv1D`` -> either its **cores** (dead ranks sliced out, gates folded in),
  contracted on every call into the two factors of the bond between input and output cores and
  applied as two matmuls, or those **two factors** stored contracted (``nn.Linear(in, r)`` then
  ``nn.Linear(r, out)``), or the **dense** ``nn.Linear``. Per token the two matmuls cost
  ``r·(in + out)`` multiply-adds against ``in·out`` dense; re-contracting the cores costs a fixed
  amount per call. The cores are kept when that contraction costs at most ``CONTRACTION_SHARE``
  (10 %) of the layer's matmuls for the tokens the example inputs send through it: the stored
  weights are then the pruned parameters (the factors are about 5x larger at the paper's ranks)
  for a few per cent of time. Otherwise the factors, unless dense is smaller.
* ``TTEmbedding`` -> its **cores** and the **hot rows** it counted (``CoresEmbedding``): a hot id
  is a hash lookup and a gather, any other id the product of its core slices; so the file holds
  about the pruned parameters plus the cache. The dense ``nn.Embedding`` when that is smaller, or
  when the table fits its cache (then it is served whole anyway).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning.layers import TTEmbedding, TTLinear
from comera_lightning.layers.contraction import chain_cost, contract_chain
from comera_lightning.layers.hot_rows import HotRowIndex, hash_slot
from comera_lightning.layers.tt_rows import chain_rows
from comera_lightning.layers.shapes import prod

__all__ = ["CONTRACTION_SHARE", "CoresLinear", "CoresEmbedding", "FactorsLinear", "embedding_form", "linear_form"]

#: The largest share of a layer's matmul work that re-contracting its cores on every call may add.
CONTRACTION_SHARE = 0.1


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


def _contraction_cost(layer: TTLinear) -> int:
    bonds, sizes, split = [1, *layer.physical_ranks, 1], [c.shape[1] for c in layer.cores], len(layer.in_modes)
    return chain_cost(bonds[: split + 1], sizes[:split]) + chain_cost(bonds[split:], sizes[split:])


def linear_form(layer: TTLinear, tokens: int = 0) -> nn.Module:
    """The cores, two factors or one dense ``nn.Linear`` (module docstring), for ``tokens`` rows per call (0: unknown)."""
    with torch.no_grad():
        split = len(layer.in_modes)
        rank = layer.physical_ranks[split - 1]
        matmuls = rank * (layer.in_features + layer.out_features)
        if matmuls >= layer.in_features * layer.out_features:
            return layer.to_linear()
        if tokens and _contraction_cost(layer) <= CONTRACTION_SHARE * tokens * matmuls:
            return CoresLinear(layer)
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
    """``nn.Embedding`` stored as its TT cores plus the hot rows: a hot id is a gather, any other id a chain product.

    ``tags``/``position`` are the layer's hash index (``layers/hot_rows.py``); empty when no ids
    were counted, and then every id is contracted from the cores (``layers/tt_rows.py``).
    """

    def __init__(self, layer: TTEmbedding, index: HotRowIndex | None, hot_rows: torch.Tensor | None) -> None:
        super().__init__()
        self.cores = nn.ParameterList(nn.Parameter(c.detach().clone(), requires_grad=False) for c in layer.gated_cores())
        device = layer.cores[0].device
        self.register_buffer("tags", index.tags.clone() if index is not None else torch.empty(0, dtype=torch.long, device=device))
        self.register_buffer("position", index.position.clone() if index is not None else torch.empty(0, dtype=torch.int32, device=device))
        self.register_buffer("hot_rows", hot_rows.detach().clone() if hot_rows is not None else layer.cores[0].new_zeros(0, layer.embedding_dim))
        self.row_modes, self.embedding_dim, self.padding_idx = tuple(layer.row_modes), layer.embedding_dim, layer.padding_idx
        self.mask = max(self.tags.numel() - 1, 0)

    def _contract(self, ids: torch.Tensor) -> torch.Tensor:
        return chain_rows(list(self.cores), self.row_modes, ids)[:, : self.embedding_dim]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).long()  # (the hash needs int64: narrower ids would overflow)
        if not self.tags.numel():
            rows = self._contract(flat)
        else:
            # Not layers.hot_rows.serve_rows: its "any misses?" host branch cannot be exported; here the
            # misses are a data-dependent index (empty or not) that torch.export keeps symbolic.
            slot = hash_slot(flat, self.mask)
            hit = self.tags.index_select(0, slot) == flat
            rows = F.embedding(self.position.index_select(0, slot).long(), self.hot_rows)
            miss = (~hit).nonzero().squeeze(1)
            rows = rows.index_copy(0, miss, self._contract(flat.index_select(0, miss)))
        if self.padding_idx is not None:
            rows = rows * (flat != self.padding_idx).unsqueeze(1).to(rows.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)


def embedding_form(layer: TTEmbedding) -> nn.Module:
    """The cores and the hot rows counted so far (:class:`CoresEmbedding`), or ``nn.Embedding`` when that is smaller."""
    with torch.no_grad():
        if layer.cache_rows and layer.caches_whole_table or 0 in layer.physical_ranks:
            return layer.to_embedding()  # a table that fits its cache is served whole (a dead one is zeros): a dense table
        index, hot_rows = layer.build_hot_rows() if layer.cache_rows and layer.has_counts() else (None, None)
        form = CoresEmbedding(layer, index, hot_rows)
        stored = sum(t.numel() * t.element_size() for t in (*form.cores, *form.buffers()))
        if stored >= layer.num_embeddings * layer.embedding_dim * layer.cores[0].element_size():
            return layer.to_embedding()
        return form
