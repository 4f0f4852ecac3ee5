"""CriteoDataModule: TSV files read (missing ones reported), batches a TorchRec EmbeddingBagCollection takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.click_logs import DatasetNotFoundError  # noqa: E402
from comera_lightning.data.criteo import CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES, CriteoDataModule  # noqa: E402
from tests.helpers.criteo_lines import SMALL_SIZES, make_line, write_lines  # noqa: E402


def test_datamodule_reads_files_and_reports_missing_ones(tmp_path: Path) -> None:
    train = write_lines(tmp_path / "train.txt", [make_line(i, label=i % 2) for i in range(10)])
    val = write_lines(tmp_path / "val.txt", [make_line(i) for i in range(3)])
    dm = CriteoDataModule(train_files=[str(train)], val_files=str(val), batch_size=4, table_sizes=SMALL_SIZES)
    dm.setup("fit")
    assert dm.feature_names == CRITEO_CAT_NAMES and dm.num_dense == 13 and dm.table_sizes == SMALL_SIZES
    assert [b.batch_size for b in dm.train_dataloader()] == [4, 4, 2]
    assert [b.batch_size for b in dm.val_dataloader()] == [3]
    with pytest.raises(ValueError, match="test_files"):
        dm.test_dataloader()
    assert CriteoDataModule().table_sizes == CRITEO_KAGGLE_TABLE_SIZES
    with pytest.raises(DatasetNotFoundError, match="nope.txt"):
        CriteoDataModule(train_files=str(tmp_path / "nope.txt")).setup("fit")
    with pytest.raises(ValueError, match="table_sizes"):
        CriteoDataModule(table_sizes=[10] * 25)


def test_embedding_bag_collection_consumes_a_criteo_batch(tmp_path: Path) -> None:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    path = write_lines(tmp_path / "day.txt", [make_line(i) for i in range(6)])
    dm = CriteoDataModule(train_files=str(path), batch_size=6, table_sizes=SMALL_SIZES)
    batch = next(iter(dm.train_dataloader()))
    ebc = EmbeddingBagCollection(tables=dm.embedding_bag_configs(4), device=torch.device("cpu"))
    pooled = ebc(batch.sparse)
    assert pooled.keys() == CRITEO_CAT_NAMES and pooled.values().shape == (6, 26 * 4)
