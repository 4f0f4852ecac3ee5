"""Synthetic Criteo-shaped click batches: power-law ids per table, seeded per batch, for benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from comera_lightning.data.click_logs import ClickBatch, kjt_from_id_matrix
from comera_lightning.data.criteo.tsv import NUM_DENSE

__all__ = ["SyntheticCriteoDataset", "power_law_ids"]

_MASK64 = (1 << 64) - 1


def power_law_ids(num_samples: int, size: int, exponent: float, generator: torch.Generator) -> Tensor:
    """Draw ``num_samples`` ranks in ``[0, size)`` with P(rank r) ∝ (r + 1)^-exponent, approximately.

    Inverse-CDF sampling of a power law on ``[1, size + 1)``, floored; exact Zipf needs a
    normaliser over ``size`` terms, which is too slow for tens of millions of rows.
    """
    u = torch.rand(num_samples, generator=generator, dtype=torch.float64)
    if abs(exponent - 1.0) < 1e-9:
        x = torch.exp(u * math.log(size + 1))
    else:
        one_minus = 1.0 - exponent
        top = (size + 1) ** one_minus
        x = (1.0 + u * (top - 1.0)) ** (1.0 / one_minus)
    return (x.floor().to(torch.int64) - 1).clamp_(0, size - 1)


def _mix_seed(*parts: int) -> int:
    """Hash integers into one 32-bit seed (torch's CPU generator only uses the low 32 bits)."""
    state = 0
    for part in parts:
        state = (state ^ (part & _MASK64)) * 0x9E3779B97F4A7C15 & _MASK64  # splitmix64 step
        state ^= state >> 30
        state = state * 0xBF58476D1CE4E5B9 & _MASK64
        state ^= state >> 27
        state = state * 0x94D049BB133111EB & _MASK64
        state ^= state >> 31
    return (state ^ (state >> 32)) & 0xFFFFFFFF


def _scatter_multiplier(size: int) -> int:
    """A multiplier coprime to ``size``, so ``rank * m % size`` is a bijection on ``[0, size)``.

    Returns 1 (no scattering) for tables of 2**31 rows or more, where the int64 product could overflow.
    """
    if size >= 2**31:
        return 1
    multiplier = 2654435761 % size or 1  # Knuth's multiplicative-hash constant
    while math.gcd(multiplier, size) != 1:
        multiplier += 1
    return multiplier


class SyntheticCriteoDataset(Dataset):
    """Deterministic synthetic Criteo-shaped batches: item ``i`` is batch ``i``, seeded by (seed, stream, i).

    Ids follow a power law per table (hot ids repeat within a batch, as in real click logs),
    scattered over the table by a fixed bijection; dense features are log1p of exponential
    counts; labels are Bernoulli with a logit linear in the dense features (weights fixed by
    ``seed`` alone, so every ``stream``, i.e. split, shares them; about 25 % positives, as in Criteo).
    """

    def __init__(
        self,
        num_batches: int,
        batch_size: int,
        table_sizes: Sequence[int],
        num_dense: int = NUM_DENSE,
        zipf_exponent: float = 1.05,
        seed: int = 0,
        stream: int = 0,
        scatter_ids: bool = True,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.num_batches = num_batches
        self.batch_size = batch_size
        self.table_sizes = [int(s) for s in table_sizes]
        self.num_dense = num_dense
        self.zipf_exponent = zipf_exponent
        self.seed = seed
        self.multipliers = [_scatter_multiplier(s) if scatter_ids else 1 for s in self.table_sizes]
        self.feature_names = [f"cat_{i}" for i in range(len(self.table_sizes))]
        weights = torch.Generator().manual_seed(seed)
        self._label_weights = torch.randn(num_dense, generator=weights) / math.sqrt(num_dense)

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> ClickBatch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} out of range [0, {self.num_batches}).")
        generator = torch.Generator().manual_seed(_mix_seed(self.seed, self.stream, index))
        batch = self.batch_size
        ids = torch.empty(batch, len(self.table_sizes), dtype=torch.int64)
        for column, (size, multiplier) in enumerate(zip(self.table_sizes, self.multipliers)):
            ranks = power_law_ids(batch, size, self.zipf_exponent, generator)
            ids[:, column] = ranks * multiplier % size if multiplier != 1 else ranks
        counts = torch.empty(batch, self.num_dense).exponential_(0.1, generator=generator)
        dense = counts.floor().log1p()
        logits = (dense - 2.0) @ self._label_weights - 1.35
        labels = torch.bernoulli(torch.sigmoid(logits), generator=generator)
        return ClickBatch(dense=dense, sparse=kjt_from_id_matrix(self.feature_names, ids), labels=labels)
