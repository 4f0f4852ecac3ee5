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
* ``TTEmbedding`` -> **two half tables**, the TT fast lookup with its tables built once: row ``i``
  is ``left[i // N_R] @ right[i % N_R]`` (``(M_L, r) @ (r, M_R)``). The cut is the bond with the
  smallest tables; the dense ``nn.Embedding`` when that is smaller.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning.layers import TTEmbedding, TTLinear
from comera_lightning.layers.contraction import chain_cost, contract_chain
from comera_lightning.layers.shapes import prod

__all__ = ["CONTRACTION_SHARE", "CoresLinear", "FactorizedEmbedding", "FactorsLinear", "embedding_form", "linear_form"]

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


class FactorizedEmbedding(nn.Module):
    """``nn.Embedding`` whose table is two half tables: ``row(i) = left[i // n_right] @ right[i % n_right]``."""

    def __init__(self, left: torch.Tensor, right: torch.Tensor, embedding_dim: int, padding_idx: int | None) -> None:
        super().__init__()
        self.register_buffer("left", left.detach().clone())  # (N_L, M_L, r)
        self.register_buffer("right", right.detach().clone())  # (N_R, r, M_R)
        self.embedding_dim, self.padding_idx = embedding_dim, padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        n_right = self.right.shape[0]
        left = F.embedding(flat // n_right, self.left.flatten(1)).view(-1, *self.left.shape[1:])
        right = F.embedding(flat % n_right, self.right.flatten(1)).view(-1, *self.right.shape[1:])
        rows = torch.bmm(left, right).flatten(1)[:, : self.embedding_dim]
        if self.padding_idx is not None:
            rows = rows * (flat != self.padding_idx).unsqueeze(1).to(rows.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)


def embedding_form(layer: TTEmbedding) -> nn.Module:
    """Half tables at the bond where they are smallest, or the dense ``nn.Embedding`` when that is smaller."""
    with torch.no_grad():
        tables = [layer.half_tables(split) for split in range(1, len(layer.cores))]
        left, right = min(tables, key=lambda pair: pair[0].numel() + pair[1].numel())
        if left.numel() + right.numel() >= layer.num_embeddings * layer.embedding_dim:
            return layer.to_embedding()
        return FactorizedEmbedding(left, right, layer.embedding_dim, layer.padding_idx)
