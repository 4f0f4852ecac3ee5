"""Each TT layer's cheapest plain-PyTorch inference form, for ``comera_lightning.export``.

The forms hold only plain tensors and plain ops (``F.linear``, ``F.embedding``, ``bmm``), so an
exported program needs torch alone:

* ``TTLinear`` / ``TTConv1D`` -> **two factors** ``A (r, in)`` and ``B (out, r)`` of the bond between
  the input and the output cores, applied as two matmuls (``nn.Linear(in, r)`` then
  ``nn.Linear(r, out)``): ``r·(in + out)`` multiply-adds and parameters per token, against
  ``in·out`` for the dense weight. Chosen whenever it is smaller than dense; otherwise the
  dense ``nn.Linear``. The cores themselves are smaller still, but running from them means
  contracting them again on every call (what ``TTLinear.forward`` pays in training); the
  factors are contracted once, here.
* ``TTEmbedding`` -> **two half tables**, the TT fast lookup with its tables built once: row ``i``
  is ``left[i // N_R] @ right[i % N_R]`` (``(M_L, r) @ (r, M_R)``). The cut is the bond with the
  smallest tables; the dense ``nn.Embedding`` when that is smaller.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import TTEmbedding, TTLinear
from .layers.shapes import prod

__all__ = ["FactorizedEmbedding", "embedding_form", "linear_form"]


def linear_form(layer: TTLinear) -> nn.Module:
    """Two ``nn.Linear`` through the input/output bond, or one dense ``nn.Linear`` when that is smaller."""
    with torch.no_grad():
        split = len(layer.in_modes)
        left, right = layer.halves(split)
        rank = left.shape[-1]
        if rank * (layer.in_features + layer.out_features) >= layer.in_features * layer.out_features:
            return layer.to_linear()
        a = left.reshape(prod(layer.in_modes), rank)[: layer.in_features]
        b = right.reshape(rank, prod(layer.out_modes))[:, : layer.out_features]
        first = nn.Linear(layer.in_features, rank, bias=False, device=a.device, dtype=a.dtype)
        second = nn.Linear(rank, layer.out_features, bias=layer.bias is not None, device=a.device, dtype=a.dtype)
        first.weight.copy_(a.T)
        second.weight.copy_(b.T)
        if layer.bias is not None:
            second.bias.copy_(layer.bias)
    return nn.Sequential(first, second)


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
