"""The layout a trained token table starts in (``init="svd"``, ``embedding_num_cores`` unset): the one that keeps more of it.

A trained table is compressed from its weights, so the layout that loses least of them at the start size is the
better start. Two factors (rows × rank, rank × dim: the table's truncated SVD, the best approximation of its size) or
the two-core TT-matrix (the package's token table from scratch, chosen on the quality race). Both errors come from
singular values alone: the table's own for two factors, those of its reshaped (row₁·col₁) × (row₂·col₂) matrix for
the TT-matrix (one bond: its TT-SVD truncates that matrix's spectrum). Measured (docs/COMPRESS.md): a trained GPT-2's
512 × 64 table at 12,288 parameters has relative error 0.668 as the TT-matrix and 0.551 as two factors, and as two
factors the model compresses better at 2x and 4x; a trained Llama's table is level in both layouts (within 0.01) and
did better as the TT-matrix at 4x, so only a clear margin (``CLEARLY_BETTER``) leaves the TT-matrix.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from comera_lightning.layers.shapes import bond_rank_caps, table_modes
from comera_lightning.tensorize.config import TRAINED_TABLE_CORES

__all__ = ["CLEARLY_BETTER", "TALL_TABLE_ROWS_PER_COLUMN", "TOKEN_TABLE_CORES", "token_table_cores"]

#: A token table's cores from scratch: a two-core TT-matrix (docs/TUNING_QUALITY_RACE.md).
TOKEN_TABLE_CORES = 2
#: A trained ``nn.Embedding`` with at least this many rows per column starts as two factors without measuring (a BERT's
#: 8,192 × 128 table: +1.6 / +0.8 points of accuracy at 8x / 32x, two seeds: docs/COMPRESS_CLASSIFIERS.md).
TALL_TABLE_ROWS_PER_COLUMN = 32
#: Two factors are chosen when their relative error is at most this share of the TT-matrix's at the same parameters.
CLEARLY_BETTER = 0.9

#: Each table measured (weakly held: a new tensor at a freed one's address is not mistaken for it): its version, spectra.
_SPECTRA: dict[int, tuple[weakref.ref, int, torch.Tensor, torch.Tensor]] = {}


def token_table_cores(weight: torch.Tensor, max_rank: int | Sequence[int]) -> int:
    """Cores of a trained token table whose layout is not given: two factors when the table is tall or they keep clearly
    more of it than the TT-matrix at ``max_rank`` (at the TT-matrix's parameters); else the TT-matrix. A table no taller
    than wide (a position or token-type table), or one without values (the meta device), keeps the TT-matrix."""
    rows, dim = weight.shape
    if rows >= TALL_TABLE_ROWS_PER_COLUMN * dim:
        return TRAINED_TABLE_CORES
    if rows <= dim or weight.is_meta:
        return TOKEN_TABLE_CORES
    tt_error, tt_parameters = _tt_matrix_error(weight, max_rank)
    factors_error = _two_factor_error(weight, max(1, tt_parameters // (rows + dim)))
    return TRAINED_TABLE_CORES if factors_error <= CLEARLY_BETTER * tt_error else TOKEN_TABLE_CORES


def _spectra(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values of the table and of its two-core TT-matrix unfolding (kept per tensor version: the start caps
    plan the same tables several times)."""
    known = _SPECTRA.get(id(weight))
    if known is None or known[0]() is not weight or known[1] != weight._version:
        rows, dim = weight.shape
        (r1, r2), (c1, c2) = table_modes(rows, dim, TOKEN_TABLE_CORES, None, None)
        table = weight.detach().float()
        padded = table.new_zeros(r1 * r2, c1 * c2)
        padded[:rows, :dim] = table
        unfolded = padded.reshape(r1, r2, c1, c2).permute(0, 2, 1, 3).reshape(r1 * c1, r2 * c2)
        for key in [k for k, v in _SPECTRA.items() if v[0]() is None]:
            del _SPECTRA[key]
        known = _SPECTRA[id(weight)] = (weakref.ref(weight), weight._version, torch.linalg.svdvals(table),
                                        torch.linalg.svdvals(unfolded))
    return known[2], known[3]


def _tail_share(singular_values: torch.Tensor, rank: int) -> float:
    """Relative Frobenius error of the best rank-``rank`` approximation, from its singular values."""
    energy = singular_values.double().pow(2)
    return float((energy[rank:].sum() / energy.sum().clamp_min(1e-30)).sqrt())


def _tt_matrix_error(weight: torch.Tensor, max_rank: int | Sequence[int]) -> tuple[float, int]:
    """The two-core TT-matrix's relative error at ``max_rank`` (capped as the layer caps it) and its parameters."""
    rows, dim = weight.shape
    row_modes, col_modes = table_modes(rows, dim, TOKEN_TABLE_CORES, None, None)
    sizes = [r * c for r, c in zip(row_modes, col_modes)]
    (rank,) = bond_rank_caps(sizes, max_rank)
    return _tail_share(_spectra(weight)[1], rank), rank * sum(sizes)


def _two_factor_error(weight: torch.Tensor, rank: int) -> float:
    """The table's truncated SVD's relative error at ``rank``."""
    return _tail_share(_spectra(weight)[0], rank)
