"""Contracting chains of tensor-train cores in the cheapest order, and TT-SVD."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

__all__ = ["chain_cost", "contract_chain", "tt_svd"]


@lru_cache(maxsize=1024)
def _chain_plan(ranks: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, object]:
    """Matrix-chain DP over a train: returns (flops, tree) for cores i..j.

    ``ranks`` has len(sizes)+1 entries (r_0..r_K). Merging [i..k] with [k+1..j] costs
    r_i · S(i..k) · r_{k+1} · S(k+1..j) · r_{j+1} multiply-adds.
    """
    n = len(sizes)
    prefix = [1]
    for s in sizes:
        prefix.append(prefix[-1] * s)

    def span(i: int, j: int) -> int:  # product of sizes[i..j]
        return prefix[j + 1] // prefix[i]

    cost = [[0] * n for _ in range(n)]
    tree: list[list[object]] = [[i if i == j else None for j in range(n)] for i in range(n)]
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            best = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + ranks[i] * span(i, k) * ranks[k + 1] * span(k + 1, j) * ranks[j + 1]
                if best is None or c < best:
                    best, tree[i][j] = c, (tree[i][k], tree[k + 1][j])
            cost[i][j] = best
    return cost[0][n - 1], tree[0][n - 1]


def _plan(ranks: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, object]:
    """``_chain_plan``; while torch.compile traces, the function itself (it warns when it meets the cache's wrapper)."""
    return (_chain_plan.__wrapped__ if torch.compiler.is_compiling() else _chain_plan)(ranks, sizes)


def chain_cost(ranks: Sequence[int], sizes: Sequence[int]) -> int:
    """Multiply-adds needed to contract a train with bond ``ranks`` (r_0..r_K) and mode ``sizes``."""
    if not sizes:
        return 0
    return _plan(tuple(ranks), tuple(sizes))[0]


def contract_chain(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract cores ``(*batch, r_{k-1}, s_k, r_k)`` into one ``(*batch, r_0, ∏ s_k, r_K)`` tensor.

    The pairing order is chosen by FLOP count (matrix-chain DP); the flattened middle axis is
    row-major over the cores' modes, left to right. Leading batch dimensions (several trains of one
    layout stacked) are contracted together, one batched matmul per pairing.
    """
    ranks = tuple(c.shape[-3] for c in cores) + (cores[-1].shape[-1],)
    sizes = tuple(c.shape[-2] for c in cores)
    lead = tuple(cores[0].shape[:-3])
    _, tree = _plan(ranks, sizes)

    def evaluate(node: object) -> torch.Tensor:
        if isinstance(node, int):
            return cores[node]
        left, right = evaluate(node[0]), evaluate(node[1])
        a, sa, b = left.shape[-3:]
        sb, c = right.shape[-2:]
        return (left.reshape(*lead, a * sa, b) @ right.reshape(*lead, b, sb * c)).reshape(*lead, a, sa * sb, c)

    return evaluate(tree)


def tt_svd(tensor: torch.Tensor, max_ranks: Sequence[int]) -> list[torch.Tensor]:
    """Tensor-train SVD: best TT approximation of ``tensor`` with bond ranks ≤ ``max_ranks``.

    Sequential truncated SVDs left to right (Oseledets 2011); singular values are absorbed into
    the next core. Exact when every cap is at least the tensor's TT rank at that bond.
    Computed in float64 and returned in the input dtype.
    """
    sizes = tuple(tensor.shape)
    if len(max_ranks) != len(sizes) - 1:
        raise ValueError(f"need {len(sizes) - 1} rank caps for a {len(sizes)}-way tensor, got {list(max_ranks)}")
    work = tensor.detach().to(torch.float64)
    cores = []
    rank_left = 1
    for k, size in enumerate(sizes[:-1]):
        matrix = work.reshape(rank_left * size, -1)
        u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
        rank = max(1, min(max_ranks[k], s.numel()))
        cores.append(u[:, :rank].reshape(rank_left, size, rank))
        work = s[:rank, None] * vh[:rank]
        rank_left = rank
    cores.append(work.reshape(rank_left, sizes[-1], 1))
    return [c.to(tensor.dtype) for c in cores]
