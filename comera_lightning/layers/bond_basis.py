"""A bond's SVD basis: the change of basis that makes cutting a bond's last indices its best truncation.

A train's tensor, unfolded across bond ``k``, is ``left · diag(g) · right`` (``left``: the cores up to ``k``, ``right``:
the rest). A map ``M`` on core ``k``'s right rank axis and a matching ``N`` on core ``k + 1``'s left one leave the
tensor as it was; taken from the SVD of the unfolding, they put the bond's indices on its singular directions,
strongest first (the TT rounding step, Oseledets 2011 §3). Cutting the weakest indices then removes the least the
bond holds, in Frobenius norm (of the padded tensor, where a layer pads its modes), whatever the gates had learned
to weigh. The unfoldings are formed whole: fine for the layers this package builds (a prune's cost), not for a
4096 × 11008 layer with many cores, where QR sweeps through the cores would be the way.
"""

from __future__ import annotations

import torch

__all__ = ["svd_basis"]


def svd_basis(left: torch.Tensor, scale: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(M, N, s)`` in float64 for the unfolding ``left · diag(scale) · right`` (``left`` (P, r), ``right`` (r, Q)).

    ``(left @ M) @ (N @ right)`` equals the unfolding, with ``left @ M = Q_L U diag(√s)`` and ``N @ right =
    diag(√s) Vᵀ Q_Rᵀ`` (orthonormal ``Q``, ``U``, ``V``), ``s`` descending: both sides carry √s. Directions the
    unfolding does not have (its rank below ``r``, or singular values at rounding level) get zero maps and ``s = 0``.
    """
    rank = scale.numel()
    _, r_left = torch.linalg.qr(left.double(), mode="r")
    _, r_right = torch.linalg.qr(right.double().T, mode="r")
    u, s, vh = torch.linalg.svd((r_left * scale.double()) @ r_right.T, full_matrices=False)
    rounding = torch.finfo(torch.float64).eps * max(left.shape[0], right.shape[1], rank)
    s = torch.where(s > s.max() * rounding, s, torch.zeros_like(s))
    half = s.sqrt()
    m = torch.linalg.pinv(r_left) @ (u * half)
    n = (half[:, None] * vh) @ torch.linalg.pinv(r_right.T)
    missing = rank - s.numel()
    if missing:
        m = torch.nn.functional.pad(m, (0, missing))
        n = torch.nn.functional.pad(n, (0, 0, 0, missing))
        s = torch.nn.functional.pad(s, (0, missing))
    return m, n, s
