"""The workloads of ``embedding_speed.py``: Criteo Kaggle shapes with Zipf ids, and MovieLens-100K's real logs.

* ``criteo``: the 26 tables of ``CRITEO_KAGGLE_TABLE_SIZES`` (33.8M rows), one id per feature.
  Table ``t``'s ids are Zipf(``a``) ranks ``k`` (truncated to the table, by rejection) sent
  through the permutation ``k -> (k * P + c_t) mod n_t`` (``P`` a prime above every table size,
  ``c_t`` fixed per table), so the hot ids are scattered over the table rather than 0, 1, 2, ...
  and are the same ids for every seed: training batches (the counts) and timed batches come
  from one distribution with different seeds. Dense features are standard normal, labels 25 % clicks.
* ``movielens``: MovieLens-100K from the package's data module (the copy in the RecBole wheel):
  its 7 sparse features (genres a multi-id bag), tables of its real sizes, 5 dense features.
  The counts come from the train split (the oldest 80 % of ratings), the timed batches are
  samples of the test split (the newest 10 %): a model is served on logs newer than its training.

``--quick`` caps every Criteo table at ``QUICK_MAX_ROWS`` rows (MovieLens stays as it is).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

WORKLOADS = ("criteo", "movielens")
ZIPF_A = 1.2
HASH_PRIME = 2_654_435_761  # prime, above every table size: k -> (k * P + c) mod n is a permutation of 0..n-1
QUICK_MAX_ROWS = 5_000
CRITEO_CLICK_RATE = 0.25


@dataclass
class Workload:
    """A workload's tables and dense width, and how to draw its batches: ``sample(batch, count, seed, split)``."""

    name: str
    feature_names: list[str]
    table_sizes: list[int]
    num_dense: int
    sample: Callable[[int, int, int, str], list[Any]]
    note: str

    def configs(self, dim: int) -> list[Any]:
        """One TorchRec ``EmbeddingBagConfig`` per feature (sum pooling)."""
        from comera_lightning.data.click_logs import embedding_bag_configs

        return embedding_bag_configs(self.feature_names, self.table_sizes, dim)

    def batches(self, batch: int, count: int, *, seed: int, split: str = "test") -> list[Any]:
        """``count`` ``ClickBatch`` es of ``batch`` samples; ``split="train"``: the batches the counts are taken from."""
        return self.sample(batch, count, seed, split)


def zipf_ranks(rng: np.random.Generator, rows: int, size: int, a: float) -> np.ndarray:
    """``size`` Zipf(``a``) ranks in ``0..rows-1`` (rank 0 the hottest), the tail beyond ``rows`` rejected."""
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        draw = rng.zipf(a, size=max(1024, 2 * (size - filled)))
        draw = draw[draw <= rows][: size - filled]
        out[filled:filled + draw.size] = draw - 1
        filled += draw.size
    return out


def scatter(ranks: np.ndarray, rows: int, table: int) -> np.ndarray:
    """The ids of Zipf ranks in table number ``table``: a fixed permutation of ``0..rows-1``, per table."""
    offset = int(np.random.default_rng(10_000 + table).integers(rows))
    return (ranks * HASH_PRIME + offset) % rows


def criteo_workload(zipf_a: float, quick: bool, max_rows: int | None = None) -> Workload:
    """Criteo Kaggle's 26 tables (capped at ``QUICK_MAX_ROWS`` with ``quick``, else at ``max_rows``), Zipf ids, 13 dense features."""
    from comera_lightning.data.criteo import CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES

    cap = QUICK_MAX_ROWS if quick else max_rows
    sizes = [min(n, cap) if cap else n for n in CRITEO_KAGGLE_TABLE_SIZES]
    names = list(CRITEO_CAT_NAMES)

    def sample(batch: int, count: int, seed: int, split: str) -> list[Any]:
        import torch

        from comera_lightning.data.click_logs import ClickBatch, kjt_from_id_matrix

        rng = np.random.default_rng([seed, 1 if split == "train" else 2])
        columns = [scatter(zipf_ranks(rng, n, batch * count, zipf_a), n, t) for t, n in enumerate(sizes)]
        ids = torch.from_numpy(np.stack(columns, axis=1)).view(count, batch, len(sizes))
        dense = torch.from_numpy(rng.standard_normal((count, batch, 13), dtype=np.float32))
        labels = torch.from_numpy((rng.random((count, batch)) < CRITEO_CLICK_RATE).astype(np.float32))
        return [ClickBatch(dense[i], kjt_from_id_matrix(names, ids[i]), labels[i]) for i in range(count)]

    note = f"Criteo Kaggle table sizes{' capped at %d rows' % cap if cap else ''}, one id per " \
           f"feature, Zipf(a={zipf_a}) ranks scattered by a fixed per-table permutation"
    return Workload("criteo", names, sizes, 13, sample, note)


def movielens_workload() -> Workload:
    """MovieLens-100K's real click log: counts from the train split, timed batches sampled from the test split."""
    from comera_lightning.data.click_logs import collate_click_samples
    from comera_lightning.data.movielens import MovieLensClicksDataModule

    data = MovieLensClicksDataModule()
    data.setup()
    names = data.feature_names

    def sample(batch: int, count: int, seed: int, split: str) -> list[Any]:
        rows = data.dataset(split)
        rng = np.random.default_rng([seed, 1 if split == "train" else 2])
        picks = rng.integers(len(rows), size=(count, batch))
        return [collate_click_samples([rows[int(i)] for i in pick], names) for pick in picks]

    note = ("MovieLens-100K (RecBole wheel copy) real ids: counts from the train split (oldest 80 %), timed batches "
            "sampled from the test split (newest 10 %); genres is a multi-id bag")
    return Workload("movielens", names, data.table_sizes, data.num_dense, sample, note)


def make_workload(name: str, *, zipf_a: float = ZIPF_A, quick: bool = False, max_rows: int | None = None) -> Workload:
    """The workload called ``name`` (one of ``WORKLOADS``); ``max_rows`` caps the Criteo tables."""
    if name == "criteo":
        return criteo_workload(zipf_a, quick, max_rows)
    if name == "movielens":
        return movielens_workload()
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}.")
