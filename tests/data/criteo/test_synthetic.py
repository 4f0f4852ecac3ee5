"""Synthetic Criteo-shaped batches: in range at Criteo's cardinalities, with duplicates, deterministic per split."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.criteo import CRITEO_KAGGLE_TABLE_SIZES, SyntheticCriteoDataModule  # noqa: E402


def test_synthetic_at_criteo_cardinalities_is_in_range_with_duplicates() -> None:
    dm = SyntheticCriteoDataModule(batch_size=2048, num_batches=2, val_batches=1, test_batches=1)
    assert dm.table_sizes == CRITEO_KAGGLE_TABLE_SIZES and sum(dm.table_sizes) == 33_762_577
    batch = next(iter(dm.train_dataloader()))
    assert batch.dense.shape == (2048, 13) and torch.isfinite(batch.dense).all()
    assert 0.1 < float(batch.labels.mean()) < 0.45
    ids = batch.sparse.to_dict()
    for name, size in zip(dm.feature_names, dm.table_sizes):
        values = ids[name].values()
        assert values.numel() == 2048
        assert values.min() >= 0 and values.max() < size, name
        unique_fraction = values.unique().numel() / 2048
        assert unique_fraction < 0.8, (name, size, unique_fraction)  # power law: hot ids repeat
    biggest = ids["cat_2"].values()  # 10,131,227 rows: uniform ids would be ~all distinct
    assert biggest.max() > 5_000_000  # hot ids are scattered over the table, not packed at 0
    counts = torch.bincount(torch.unique(biggest, return_inverse=True)[1])
    assert counts.max() > 20


def test_synthetic_is_deterministic_and_splits_differ() -> None:
    dm = SyntheticCriteoDataModule(batch_size=64, num_batches=3, table_sizes=[100, 10_000], num_dense=4, seed=7)
    first, again = dm.dataset("train")[1], SyntheticCriteoDataModule(
        batch_size=64, num_batches=3, table_sizes=[100, 10_000], num_dense=4, seed=7
    ).dataset("train")[1]
    assert torch.equal(first.sparse.values(), again.sparse.values())
    assert torch.equal(first.dense, again.dense) and torch.equal(first.labels, again.labels)
    assert not torch.equal(dm.dataset("train")[0].sparse.values(), first.sparse.values())
    assert not torch.equal(dm.dataset("val")[1].sparse.values(), first.sparse.values())
    assert len(list(dm.train_dataloader())) == 3 and len(list(dm.val_dataloader())) == 10
    assert first.dense.shape == (64, 4) and dm.feature_names == ["cat_0", "cat_1"]
    with pytest.raises(ValueError, match="zipf_exponent"):
        SyntheticCriteoDataModule(zipf_exponent=0.0)
