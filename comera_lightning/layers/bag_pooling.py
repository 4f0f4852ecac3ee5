"""Pooling a collection's bags in a training step: per table, or every feature in one gather.

The rows a table pools from are its distinct ids' rows (contracted once, ``TTEmbedding.lookup``)
or a dense table's weight; ``index`` says which row each id takes. On CPU with autograd the
pooling avoids ``F.embedding_bag``, whose backward sorts the ids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from comera_lightning.layers.tt_rows import gather_rows, ids_are_checkable

__all__ = ["gather_single_ids", "pool_bags"]


def pool_bags(rows: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None, *, mean: bool) -> torch.Tensor:
    """``(len(lengths), dim)``: each bag's (weighted) sum or mean of ``rows[index]``; an empty bag gives 0."""
    if weights is not None:
        weights = weights.to(rows.dtype)
    if rows.requires_grad and rows.device.type == "cpu" and torch.is_grad_enabled():
        # embedding_bag's CPU backward sorts the ids: a gather and an index_add forward and backward
        # take half its time for a batch of 4,096 ids (measured).
        picked = gather_rows(rows, index)
        if weights is not None:
            picked = picked * weights.unsqueeze(1)
        bags = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=index.numel())
        out = picked.new_zeros(lengths.numel(), rows.shape[1]).index_add(0, bags, picked)
    else:
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        # F.embedding_bag supports per-sample weights only for "sum": a weighted mean divides afterwards.
        mode = "mean" if mean and weights is None else "sum"
        out = F.embedding_bag(index, rows, offsets, mode=mode, per_sample_weights=weights, include_last_offset=True)
        if mode == "mean":
            return out
    return out / lengths.clamp(min=1).unsqueeze(1).to(out.dtype) if mean else out


def gather_single_ids(tables: list[tuple[torch.Tensor, torch.Tensor]], lengths: list[torch.Tensor],
                      weights: list[torch.Tensor] | None, num_features: int) -> torch.Tensor | None:
    """``(B, num_features·dim)`` when every bag holds one id; None otherwise.

    ``tables``: each table's ``(rows, index)`` for the ids of its features (in output order),
    ``lengths`` and ``weights`` per table likewise. Pooling (sum or mean) is then the row itself:
    the tables' rows are stacked and one gather in batch-major order writes the output (one id per
    feature is Criteo's layout); per-table pooling and a concatenation made up ~30 of the 70 ms of
    a Criteo-shaped training step at rank 2 (profiled). Needs rows of one width, dtype and device;
    eager only, not while capturing a CUDA graph (checking the bag lengths needs a host sync).
    """
    rows = [r for r, _ in tables]
    if not ids_are_checkable() or len({(r.shape[1], r.dtype, r.device) for r in rows}) != 1:
        return None
    all_lengths = torch.cat(lengths)
    if all_lengths.numel() % num_features or not bool((all_lengths == 1).all()):
        return None
    batch, offset, indices = all_lengths.numel() // num_features, 0, []
    for block, index in tables:
        indices.append(index + offset)
        offset += block.shape[0]
    out = gather_rows(torch.cat(rows), torch.cat(indices).view(num_features, batch).t().reshape(-1))
    if weights is not None:
        out = out * torch.cat(weights).view(num_features, batch).t().reshape(-1, 1).to(out.dtype)
    return out.view(batch, -1).to(torch.promote_types(out.dtype, torch.float32))
