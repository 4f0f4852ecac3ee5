"""Rows of a TT-matrix table contracted per id from the cores, with no table built first (TT-Rec's lookup).

Row ``i`` of the table has row digits ``(i_1, …, i_d)`` in the row modes (row-major) and is the
product of the core slices ``G_k[:, i_k, :, :]``, each ``(r_{k-1}, m_k, r_k)``. Gathering those
slices for a batch of ids and multiplying them left to right costs a fixed number
of multiply-adds per id and nothing per call: the cheaper lookup when a batch touches few rows of
a large table (training steps on click logs), where the half-table lookup would first contract
tables far larger than the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["chain_cost_per_id", "chain_rows", "row_digits"]


def row_digits(ids: torch.Tensor, row_modes: Sequence[int]) -> list[torch.Tensor]:
    """The row-major digits of ``ids`` in ``row_modes``, first core's digit first."""
    digits, rest = [], ids
    for n in reversed(row_modes[1:]):
        digits.append(rest % n)
        rest = rest // n
    digits.append(rest)
    return digits[::-1]


def chain_cost_per_id(shapes: Sequence[Sequence[int]]) -> int:
    """Multiply-adds per id of :func:`chain_rows` for cores of ``shapes`` ``(r_{k-1}, n_k, m_k, r_k)``."""
    cost, width = 0, shapes[0][2]
    for r_left, _, m, r_right in shapes[1:]:
        cost += width * r_left * m * r_right
        width *= m
    return cost


def _slices(core: torch.Tensor, digit: torch.Tensor) -> torch.Tensor:
    """``core[:, digit]`` as ``(B, r_left, m, r_right)``; F.embedding's backward is far faster than indexing's on CPU."""
    r_left, n, m, r_right = core.shape
    return F.embedding(digit, core.transpose(0, 1).reshape(n, r_left * m * r_right)).view(-1, r_left, m, r_right)


def chain_rows(cores: Sequence[torch.Tensor], row_modes: Sequence[int], ids: torch.Tensor) -> torch.Tensor:
    """``(len(ids), ∏ m_k)`` rows of the table the (gated) ``cores`` represent, one chain product per id."""
    # Left to right: measured faster on CPU than right to left even where that needs fewer
    # multiply-adds (its products are tall and thin, (r·m) x r @ r x m, which gemm handles badly).
    rows, width = None, 1
    for core, digit in zip(cores, row_digits(ids, row_modes)):
        s = _slices(core, digit)  # (B, r, m, r')
        rows = s.flatten(1, 2) if rows is None else torch.bmm(rows, s.flatten(2)).view(ids.numel(), width * s.shape[2], s.shape[3])
        width *= s.shape[2]  # rows is (B, width, r')
    return rows.squeeze(-1)
