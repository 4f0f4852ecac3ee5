"""The Triton kernels of the two-factor lookup (``reference.py`` has the math): forward pooled bags, backward factor gradients.

Forward: one program per bag; for each of its ids, the ``(M_L, r)`` slice of ``left`` and the ``(r, M_R)`` slice of
``right`` are loaded in rank blocks and multiplied into the bag's fp32 accumulator (weighted, divided by the bag's
length for a mean); no row is ever written to memory. Backward: one program per id; the bag's output gradient,
scaled as the forward scaled that id, times the other factor's slice is atomically added to each factor's gradient
(fp32). Products use ``tl.dot`` where every block is at least 16 wide, else a broadcast multiply and a sum.
Imported only where a kernel runs (a CUDA tensor, or under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from comera_lightning._optional import require

triton = require("triton", "The fused TT lookup kernels")
tl = require("triton.language", "The fused TT lookup kernels")

__all__ = ["launch_backward", "launch_forward"]

#: Elements of the ``(M_L, r-block, M_R)`` product tile a program holds at once (the rank block shrinks to fit).
TILE_ELEMENTS = 8192


@triton.jit
def _slices(left, right, i_left, i_right, r0, rank, m_left, m_right, rows, cols,
            BLOCK_R: tl.constexpr):
    """The ``(BLOCK_ML, BLOCK_R)`` block of ``left[i_left]`` and the ``(BLOCK_R, BLOCK_MR)`` block of ``right[i_right]``."""
    ranks = r0 + tl.arange(0, BLOCK_R)
    a_mask = (rows[:, None] < m_left) & (ranks[None, :] < rank)
    b_mask = (ranks[:, None] < rank) & (cols[None, :] < m_right)
    a = tl.load(left + i_left * m_left * rank + rows[:, None] * rank + ranks[None, :], mask=a_mask, other=0.0)
    b = tl.load(right + i_right * rank * m_right + ranks[:, None] * m_right + cols[None, :], mask=b_mask, other=0.0)
    return a.to(tl.float32), b.to(tl.float32), ranks


@triton.jit
def _forward(left, right, ids, offsets, weights, out, n_right, rank, m_left, m_right,
             BLOCK_ML: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_MR: tl.constexpr,
             POOLED: tl.constexpr, WEIGHTED: tl.constexpr, MEAN: tl.constexpr, DOT: tl.constexpr):
    bag = tl.program_id(0)
    start, end = bag, bag + 1
    if POOLED:
        start = tl.load(offsets + bag)
        end = tl.load(offsets + bag + 1)
    rows, cols = tl.arange(0, BLOCK_ML), tl.arange(0, BLOCK_MR)
    acc = tl.zeros((BLOCK_ML, BLOCK_MR), dtype=tl.float32)
    for j in range(start, end):
        i = tl.load(ids + j)
        scale = 1.0
        if WEIGHTED:
            scale = tl.load(weights + j).to(tl.float32)
        row = tl.zeros((BLOCK_ML, BLOCK_MR), dtype=tl.float32)
        for r0 in range(0, rank, BLOCK_R):
            a, b, _ = _slices(left, right, i // n_right, i % n_right, r0, rank, m_left, m_right, rows, cols, BLOCK_R)
            if DOT:
                row = tl.dot(a, b, row, input_precision="ieee")
            else:
                row += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
        acc += row * scale
    if MEAN:
        acc = acc / tl.maximum(end - start, 1).to(tl.float32)
    mask = (rows[:, None] < m_left) & (cols[None, :] < m_right)
    tl.store(out + bag * m_left * m_right + rows[:, None] * m_right + cols[None, :], acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _backward(grad, left, right, ids, bag_of, scales, grad_left, grad_right, n_right, rank, m_left, m_right,
              BLOCK_ML: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_MR: tl.constexpr, DOT: tl.constexpr):
    j = tl.program_id(0)
    i = tl.load(ids + j)
    i_left, i_right = i // n_right, i % n_right
    rows, cols = tl.arange(0, BLOCK_ML), tl.arange(0, BLOCK_MR)
    out_mask = (rows[:, None] < m_left) & (cols[None, :] < m_right)
    g = tl.load(grad + tl.load(bag_of + j) * m_left * m_right + rows[:, None] * m_right + cols[None, :], mask=out_mask, other=0.0)
    g = g.to(tl.float32) * tl.load(scales + j)
    for r0 in range(0, rank, BLOCK_R):
        a, b, ranks = _slices(left, right, i_left, i_right, r0, rank, m_left, m_right, rows, cols, BLOCK_R)
        if DOT:
            d_left = tl.dot(g, tl.trans(b), input_precision="ieee")  # (M_L, r)
            d_right = tl.dot(tl.trans(a), g, input_precision="ieee")  # (r, M_R)
        else:
            d_left = tl.sum(g[:, None, :] * b[None, :, :], axis=2)
            d_right = tl.sum(a[:, :, None] * g[:, None, :], axis=0)
        a_mask = (rows[:, None] < m_left) & (ranks[None, :] < rank)
        b_mask = (ranks[:, None] < rank) & (cols[None, :] < m_right)
        tl.atomic_add(grad_left + i_left * m_left * rank + rows[:, None] * rank + ranks[None, :], d_left, mask=a_mask)
        tl.atomic_add(grad_right + i_right * rank * m_right + ranks[:, None] * m_right + cols[None, :], d_right, mask=b_mask)


def _blocks(m_left: int, rank: int, m_right: int) -> dict:
    """Power-of-two blocks covering the slices, the rank block within ``TILE_ELEMENTS``; ``DOT`` where tl.dot applies."""
    block_ml, block_mr = triton.next_power_of_2(m_left), triton.next_power_of_2(m_right)
    fit = max(1, TILE_ELEMENTS // (block_ml * block_mr))
    block_r = min(triton.next_power_of_2(max(rank, 1)), 1 << (fit.bit_length() - 1))
    dot = min(block_ml, block_r, block_mr) >= 16
    return {"BLOCK_ML": block_ml, "BLOCK_R": block_r, "BLOCK_MR": block_mr, "DOT": dot}


def launch_forward(left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None,
                   weights: torch.Tensor | None, mean: bool) -> torch.Tensor:
    """``(bags, M_L·M_R)`` pooled rows (``offsets`` None: one bag per id, no pooling)."""
    (_, m_left, rank), (n_right, _, m_right) = left.shape, right.shape
    bags = ids.numel() if offsets is None else offsets.numel() - 1
    out = left.new_empty(bags, m_left * m_right)
    if bags:
        _forward[(bags,)](left, right, ids, offsets if offsets is not None else ids, weights if weights is not None else left,
                          out, n_right, rank, m_left, m_right, POOLED=offsets is not None, WEIGHTED=weights is not None,
                          MEAN=mean, **_blocks(m_left, rank, m_right))
    return out


def launch_backward(grad: torch.Tensor, left: torch.Tensor, right: torch.Tensor, ids: torch.Tensor, bag_of: torch.Tensor,
                    scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors' gradients, accumulated in fp32 and returned in their dtype."""
    (_, m_left, rank), (n_right, _, m_right) = left.shape, right.shape
    grad_left = torch.zeros(left.shape, dtype=torch.float32, device=left.device)
    grad_right = torch.zeros(right.shape, dtype=torch.float32, device=right.device)
    if ids.numel() and rank:
        _backward[(ids.numel(),)](grad.contiguous(), left, right, ids, bag_of, scales, grad_left, grad_right, n_right, rank,
                                  m_left, m_right, **_blocks(m_left, rank, m_right))
    return grad_left.to(left.dtype), grad_right.to(right.dtype)
