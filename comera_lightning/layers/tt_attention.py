"""TTMultiheadAttention: ``nn.MultiheadAttention`` with its four projections as tensor trains.

``nn.MultiheadAttention`` keeps the query/key/value projections packed in one ``in_proj_weight``
(or three ``*_proj_weight`` when key and value widths differ) and reads them directly, so its
projections cannot be swapped one by one. This module holds them as four :class:`TTLinear`
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) and computes the same attention with
``F.scaled_dot_product_attention`` (the fused kernel) when no weights are asked for, and with an
explicit softmax when they are. It takes MHA's call signature and masks (boolean or additive
``attn_mask`` and ``key_padding_mask``, ``is_causal``, ``batch_first``, unbatched inputs).

It also answers what ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder`` read to choose
their fused inference path (``in_proj_weight``, ``in_proj_bias``, ``_qkv_same_embed_dim``, ...):
under ``no_grad`` in eval mode those layers then run torch's fused kernel on the dense weights
the trains stand for (contracted once and cached until a parameter changes); in training, or with
grad enabled, everything runs through the trains.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning.layers.interface import LayerSummary, TensorizedModule
from comera_lightning.layers.tt_linear import TTLinear

__all__ = ["TTMultiheadAttention"]


class TTMultiheadAttention(TensorizedModule):
    """Multi-head attention whose projections are ``TTLinear`` trains (same function as ``nn.MultiheadAttention``)."""

    def __init__(
        self, q_proj: TTLinear, k_proj: TTLinear, v_proj: TTLinear, out_proj: TTLinear, num_heads: int,
        dropout: float = 0.0, batch_first: bool = False,
    ) -> None:
        super().__init__()
        embed_dim = q_proj.out_features
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}.")
        for name, proj in (("k_proj", k_proj), ("v_proj", v_proj), ("out_proj", out_proj)):
            if proj.out_features != embed_dim:
                raise ValueError(f"{name} has {proj.out_features} outputs; attention of width {embed_dim} needs {embed_dim}.")
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = q_proj, k_proj, v_proj, out_proj
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = k_proj.in_features, v_proj.in_features
        self.dropout, self.batch_first = float(dropout), batch_first
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim

    # ---------------------------------------------------------------- what nn.Transformer*Layer reads
    def _trains(self) -> bool:
        """Whether q/k/v are still trains (not ``export``'s inference forms, which have no dense weight to read)."""
        return all(isinstance(p, TTLinear) for p in (self.q_proj, self.k_proj, self.v_proj))

    @property
    def in_proj_weight(self) -> torch.Tensor | None:
        """The packed ``(3E, E)`` projection weight the trains stand for.

        None when key/value widths differ, or once ``export`` put the projections in their inference form: torch's
        layers then call this module's forward instead of their fused kernel (which would need the dense weights).
        """
        if not (self._qkv_same_embed_dim and self._trains()):
            return None
        return torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])

    #: How nn.TransformerEncoderLayer's fused path combines masks (it uses only ``num_heads``).
    merge_masks = nn.MultiheadAttention.merge_masks

    @property
    def in_proj_bias(self) -> torch.Tensor | None:
        """The packed ``(3E,)`` projection bias (None without biases, or once in export's inference form)."""
        if not self._trains():
            return None
        biases = [p.bias for p in (self.q_proj, self.k_proj, self.v_proj)]
        return None if any(b is None for b in biases) else torch.cat(biases)

    # ---------------------------------------------------------------- forward
    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True, attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``nn.MultiheadAttention.forward``: (output, averaged or per-head attention weights or None)."""
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint (as nn.MultiheadAttention does).")
        target, batch, _ = query.shape
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        mask = _additive_mask(attn_mask, key_padding_mask, batch, self.num_heads, target, k.shape[2], q.dtype)
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            scores = (q @ k.transpose(-2, -1)) / self.head_dim**0.5
            weights = torch.softmax(scores + mask if mask is not None else scores, dim=-1)
            out = F.dropout(weights, dropout, self.training) @ v
        else:
            causal = is_causal and key_padding_mask is None  # the mask is known to be causal: let the kernel build it
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, dropout_p=dropout, is_causal=causal)
            weights = None
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(target, batch, self.embed_dim))  # (L, N, E)
        if unbatched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None:
            weights = weights.mean(dim=1) if average_attn_weights else weights
            weights = weights.squeeze(0) if unbatched else weights
        return out, weights

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(L, N, E) → (N, heads, L, head_dim)."""
        length, batch, _ = x.shape
        return x.reshape(length, batch, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    # ---------------------------------------------------------------- TensorizedModule
    def projections(self) -> tuple[TTLinear, TTLinear, TTLinear, TTLinear]:
        """q, k, v and output projections."""
        return self.q_proj, self.k_proj, self.v_proj, self.out_proj

    def dense_parameters(self) -> int:
        """Parameters of the ``nn.MultiheadAttention`` this module replaces."""
        return sum(p.dense_parameters() for p in self.projections())

    def to_dense_module(self) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention`` computing the same function (masked gates included)."""
        q, k, v, out = self.projections()
        bias = q.bias is not None
        weight = q.cores[0]
        mha = nn.MultiheadAttention(self.embed_dim, self.num_heads, self.dropout, bias, kdim=self.kdim, vdim=self.vdim,
                                    batch_first=self.batch_first, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            if self._qkv_same_embed_dim:
                mha.in_proj_weight.copy_(self.in_proj_weight)
            else:
                for name, proj in (("q_proj_weight", q), ("k_proj_weight", k), ("v_proj_weight", v)):
                    getattr(mha, name).copy_(proj.weight_matrix())
            if bias:
                mha.in_proj_bias.copy_(self.in_proj_bias)
                mha.out_proj.bias.copy_(out.bias)
            mha.out_proj.weight.copy_(out.weight_matrix())
        return mha

    def summary(self) -> LayerSummary:
        """Kind, (embed_dim, 4·embed_dim), each projection's modes, the query projection's stored ranks."""
        modes = " ".join(p.summary().modes for p in self.projections()[:1])
        return LayerSummary("mha", (self.embed_dim, 4 * self.embed_dim), f"4×{modes}", self.q_proj.physical_ranks)


def _additive_mask(
    attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, batch: int, heads: int, target: int, source: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """MHA's two masks (boolean: True = not allowed; or additive floats) as one additive ``(N|1, H|1, L, S)`` mask."""
    mask = None
    if attn_mask is not None:
        mask = _as_additive(attn_mask, dtype)
        mask = mask.reshape(batch, heads, target, source) if mask.dim() == 3 else mask.reshape(1, 1, target, source)
    if key_padding_mask is not None:
        padding = _as_additive(key_padding_mask, dtype).reshape(batch, 1, 1, source)
        mask = padding if mask is None else mask + padding
    return mask


def _as_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)
