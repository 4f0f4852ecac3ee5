"""Rows of a TT-matrix table contracted per id from the cores, with no table built first (TT-Rec's lookup).

Row ``i`` of the table has row digits ``(i_1, …, i_d)`` in the row modes (row-major) and is the
product of the core slices ``G_k[:, i_k, :, :]``, each ``(r_{k-1}, m_k, r_k)``. Gathering those
slices for a batch of ids and multiplying them costs a fixed number of multiply-adds per id and
nothing per call: the cheaper lookup when a batch touches few rows of a large table (training
steps on click logs), where the half-table lookup would first contract tables far larger than
the batch.

Two ways to multiply the chain: :func:`chain_rows` (one small product per id and core: traceable,
the one exported programs use) and :func:`grouped_chain_rows`, which groups the ids by each
middle core's digit so that every slice of that core multiplies all of its ids in one larger product
(a padded batched matmul whose core gradient needs no scatter): 1.5-2.5x faster forward and backward
for a training step's thousand-odd distinct ids on CPU (measured), and it needs a host sync
(``TTEmbedding.lookup`` takes it in eager mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["chain_cost_per_id", "chain_rows", "check_ids", "gather_rows", "grouped_chain_rows", "grouped_cost_per_id",
           "ids_are_checkable", "row_digits"]

#: A middle core is multiplied by digit groups while its padded groups hold at most this many times
#: the ids (padding is wasted work; Criteo-shaped training batches pad 1.4-2.4x; the bound is chosen, not tuned).
MAX_GROUP_PADDING = 4


def ids_are_checkable() -> bool:
    """Host syncs (range checks, data-dependent shapes) are allowed: not compiling, not capturing a CUDA graph."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_ids(ids: torch.Tensor, num_rows: int) -> None:
    """Raise on non-integer ids or one outside ``0..num_rows-1`` (eager: one host sync; captured: a device assert)."""
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"TTEmbedding expects integer ids, got dtype {ids.dtype}.")
    if not ids.numel():
        return
    if not ids_are_checkable():
        if not torch.compiler.is_compiling():  # capturing a CUDA graph: a device-side assert, run on every replay
            valid = ((ids >= 0) & (ids < num_rows)).all()
            torch._assert_async(valid, f"an id is out of range for a TTEmbedding of {num_rows} rows (valid: 0..{num_rows - 1}).")
        return
    extent = torch.aminmax(ids)  # (one pass)
    low, high = int(extent.min), int(extent.max)
    if low < 0 or high >= num_rows:
        bad = low if low < 0 else high
        raise IndexError(f"id {bad} is out of range for a TTEmbedding of {num_rows} rows (valid: 0..{num_rows - 1}).")


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.num_rows = table.shape[0]
        return table.index_select(0, index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.num_rows, *grad.shape[1:]).index_put_((index,), grad.contiguous(), accumulate=True), None


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table.index_select(0, index)`` with a faster backward on CPU (measured, float32 rows of 16).

    The gradient is made contiguous (a strided one, e.g. a column block of a collection's output,
    sends torch's ``index_add`` down a scatter path 3-5x slower) and accumulated with
    ``index_put_(accumulate=True)``: 2.5x faster than ``index_add`` for 100k rows, as fast for 4k.
    """
    return _GatherRows.apply(table, index)


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


def grouped_cost_per_id(shapes: Sequence[Sequence[int]]) -> int:
    """Multiply-adds per id of :func:`grouped_chain_rows` (right to left) for cores of ``shapes`` (padding not counted)."""
    cost, tail = 0, shapes[-1][2]
    for r_left, _, m, r_right in reversed(shapes[:-1]):
        cost += tail * r_right * r_left * m
        tail *= m
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
        if rows is not None and core.shape[1] == 1:  # one slice shared by every id (a two-factor table's second
            shared = core[:, 0]  # factor): one GEMM, not a copy of it per id  (r, m, r')
            rows = (rows @ shared.flatten(1)).view(ids.numel(), width * shared.shape[1], shared.shape[2])
            width *= shared.shape[1]
            continue
        s = _slices(core, digit)  # (B, r, m, r')
        rows = s.flatten(1, 2) if rows is None else torch.bmm(rows, s.flatten(2)).view(ids.numel(), width * s.shape[2], s.shape[3])
        width *= s.shape[2]  # rows is (B, width, r')
    return rows.squeeze(-1)


def _rank_in_group(digit: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each id's rank among the ids of its digit (``counts``: ids per digit); an id's slot is ``digit * width + rank``."""
    order = torch.argsort(digit, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(digit.numel(), device=digit.device) - (counts.cumsum(0) - counts)[digit[order]]
    return rank


def _grouped_product(x: torch.Tensor, core: torch.Tensor, digit: torch.Tensor, rank: torch.Tensor, width: int) -> torch.Tensor:
    """``x[j] (t, q) @ core[:, digit[j], :, :]`` seen as ``(q, p·b)``, for every id ``j``: ``(n, t, p, b)``.

    The ids are laid out in a zero-padded ``(digits, width·t, q)`` block, so every slice of the
    core is one ``(p·b, q) @ (q, width·t)`` product; written that way round, the core's gradient
    comes out of the batched matmul already in the core's slice layout.
    """
    n, t, q = x.shape
    p, groups, b, _ = core.shape
    slot = digit * width + rank
    padded = x.new_zeros(groups * width, t, q).index_copy(0, slot, x).view(groups, width * t, q)
    out = torch.bmm(core.transpose(0, 1).reshape(groups, p * b, q), padded.transpose(1, 2))  # (groups, p·b, width·t)
    return gather_rows(out.transpose(1, 2).reshape(groups * width, t, p, b), slot)


def _per_id_product(x: torch.Tensor, core: torch.Tensor, digit: torch.Tensor) -> torch.Tensor:
    """What :func:`_grouped_product` computes, one small product per id (for digits too sparse to group)."""
    p, _, b, q = core.shape
    slices = _slices(core, digit).view(-1, p * b, q)
    return torch.bmm(x, slices.transpose(1, 2)).view(x.shape[0], x.shape[1], p, b)


def grouped_chain_rows(cores: Sequence[torch.Tensor], scales: Sequence[torch.Tensor], row_modes: Sequence[int],
                       ids: torch.Tensor) -> torch.Tensor:
    """:func:`chain_rows` multiplied right to left, each middle core by digit groups where the padding stays small.

    ``scales[k]`` scales core ``k``'s right rank axis (the bond gates); applied to the ids' partial
    products, which are far smaller than the cores. The first core, and a core whose digits are too
    sparse or skewed to group (padded groups over ``MAX_GROUP_PADDING`` times the ids), take one
    product per id. Eager only, at least one id (the group sizes decide shapes: one host sync).
    """
    n = ids.numel()
    digits = row_digits(ids, row_modes)
    # The middle cores' group sizes (one host sync for all); the first core's products, (m_1, r_1) @ (r_1, tail),
    # are too thin to gain (measured).
    counts = {k: torch.bincount(digits[k], minlength=cores[k].shape[1]) for k in range(1, len(cores) - 1)}
    widths = dict(zip(counts, torch.stack([c.max() for c in counts.values()]).tolist())) if counts else {}
    last = cores[-1]  # (q, n_d, m_d, 1): each id's slice as rows (column digit) of length q
    x = F.embedding(digits[-1], last[..., 0].permute(1, 2, 0).reshape(last.shape[1], -1)).view(n, last.shape[2], last.shape[0])
    for k in reversed(range(len(cores) - 1)):
        core, digit = cores[k], digits[k]
        if k in widths and core.shape[1] * widths[k] <= MAX_GROUP_PADDING * n:
            y = _grouped_product(x * scales[k], core, digit, _rank_in_group(digit, counts[k]), widths[k])  # (n, tail, p, b)
        else:
            y = _per_id_product(x * scales[k], core, digit)
        x = y.permute(0, 3, 1, 2).reshape(n, -1, core.shape[0])  # rows (b, tail): the column digits so far, first core's first
    return x.reshape(n, -1)
