"""Criteo TSV streaming (parser, errors, files, worker sharding) and the synthetic Criteo module."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from comera_lightning.data.criteo import tsv as criteo_tsv
from comera_lightning.data.click_logs import (
    ClickBatch,
    ClickSample,
    DatasetNotFoundError,
    collate_click_samples,
    kjt_from_id_lists,
)
from comera_lightning.data.criteo import CRITEO_CAT_NAMES, CRITEO_KAGGLE_TABLE_SIZES, CriteoDataModule, CriteoIterableDataset, SyntheticCriteoDataModule
from comera_lightning.data.criteo.tsv import parse_criteo_line

SMALL_SIZES = [1000] * 26


def make_line(index: int, label: int = 1, empty: bool = False) -> str:
    """A valid Criteo line whose C1 encodes ``index`` (so a test can tell lines apart)."""
    if empty:
        return "\t".join([str(label)] + [""] * 13 + [""] * 26)
    ints = [str(index), "-1", "", "5"] + [str(k) for k in range(9)]
    cats = [f"{index:08x}", "", "ABCDEF01"] + [f"{(index * 7919 + k) % 2**32:08x}" for k in range(23)]
    return "\t".join([str(label), *ints, *cats])


def write_lines(path: Path, lines: list[str], compress: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines)
    if compress:
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


def c1_values(batches: list[ClickBatch]) -> list[int]:
    """The C1 ids of every row, in order (with table size 2**31, C1 = the line index)."""
    return [v for b in batches for v in b.sparse["cat_0"].values().tolist()]


# ----- parser --------------------------------------------------------------------------------------


def test_parse_valid_line_with_empty_fields() -> None:
    label, dense, sparse = parse_criteo_line(make_line(3, label=0) + "\n")
    assert label == 0
    assert dense[:4] == [3, -1, 0, 5]
    assert sparse[0] == 3 and sparse[1] == -1 and sparse[2] == 0xABCDEF01
    label, dense, sparse = parse_criteo_line(make_line(0, empty=True) + "\r\n")
    assert (label, dense, sparse) == (1, [0] * 13, [-1] * 26)


def test_batch_transform_log1p_and_modulo(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "day.txt", [make_line(12345), make_line(0, label=0, empty=True)])
    (batch,) = list(CriteoIterableDataset([path], batch_size=8, table_sizes=SMALL_SIZES))
    assert batch.batch_size == 2
    assert batch.labels.tolist() == [1.0, 0.0]
    expected = [math.log1p(max(x, 0)) for x in [12345, -1, 0, 5, *range(9)]]
    assert torch.allclose(batch.dense[0], torch.tensor(expected, dtype=torch.float32))
    assert (batch.dense[1] == 0).all()
    ids = batch.sparse.to_dict()
    assert ids["cat_0"].values().tolist() == [12345 % 1000, 0]
    assert ids["cat_1"].values().tolist() == [0, 0]  # empty → 0
    assert ids["cat_2"].values().tolist() == [0xABCDEF01 % 1000, 0]
    assert batch.sparse.keys() == CRITEO_CAT_NAMES
    assert (batch.sparse.lengths() == 1).all()


def _replace(line: str, column: int, value: str) -> str:
    fields = line.split("\t")
    fields[column] = value
    return "\t".join(fields)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        (make_line(2) + "\textra", "expected 40 tab-separated columns.*got 41"),
        ("\t".join(make_line(2).split("\t")[1:]), "got 39.*no label column"),
        ("1", "got 1"),  # (a blank line is skipped: test_data_reader_errors.py)
        (_replace(make_line(2), 14, "xyz12345"), "C1 holds 'xyz12345', not a hex id"),
        (_replace(make_line(2), 20, "0x1f"), "C7 holds '0x1f', not a hex id"),
        (_replace(make_line(2), 3, "1.5"), "I3 holds '1.5', not an integer"),
        (_replace(make_line(2), 1, "abc"), "I1 holds 'abc', not an integer"),
        (_replace(make_line(2), 0, "2"), "label must be 0 or 1, got '2'"),
        (_replace(make_line(2), 0, ""), "label must be 0 or 1, got ''"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    path = write_lines(tmp_path / "day_0.txt", [make_line(0), make_line(1), bad_line, make_line(3)])
    dataset = CriteoIterableDataset([path], batch_size=2, table_sizes=SMALL_SIZES)
    with pytest.raises(ValueError, match=rf"day_0\.txt, line 3: .*{problem}"):
        list(dataset)


# ----- streaming -----------------------------------------------------------------------------------


def test_streams_across_two_files_plain_and_gzip(tmp_path: Path) -> None:
    first = write_lines(tmp_path / "day_0.txt", [make_line(i) for i in range(5)])
    second = write_lines(tmp_path / "day_1.txt.gz", [make_line(i) for i in range(5, 12)], compress=True)
    dataset = CriteoIterableDataset([first, second], batch_size=4, table_sizes=[2**31] * 26)
    batches = list(dataset)
    assert [b.batch_size for b in batches] == [4, 4, 4]
    assert c1_values(batches) == list(range(12))
    dropped = CriteoIterableDataset([first, second], batch_size=5, table_sizes=[2**31] * 26, drop_last=True)
    assert [b.batch_size for b in dropped] == [5, 5]


def test_error_line_number_counts_within_the_second_file(tmp_path: Path) -> None:
    first = write_lines(tmp_path / "a.txt", [make_line(i) for i in range(3)])
    second = write_lines(tmp_path / "b.txt", [make_line(3), _replace(make_line(4), 0, "x")])
    with pytest.raises(ValueError, match=r"b\.txt, line 2: the label"):
        list(CriteoIterableDataset([first, second], batch_size=100, table_sizes=SMALL_SIZES))


def test_worker_sharding_covers_each_line_once(tmp_path: Path) -> None:
    first = write_lines(tmp_path / "day_0.txt", [make_line(i) for i in range(23)])
    second = write_lines(tmp_path / "day_1.txt", [make_line(i) for i in range(23, 40)])
    dataset = CriteoIterableDataset([first, second], batch_size=3, table_sizes=[2**31] * 26)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    seen = c1_values(list(loader))
    assert sorted(seen) == list(range(40))


def test_shards_are_disjoint_for_three_readers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_lines(tmp_path / "day.txt", [make_line(i) for i in range(31)])
    dataset = CriteoIterableDataset([path], batch_size=4, table_sizes=[2**31] * 26)
    shards = []
    for worker in range(3):
        monkeypatch.setattr(criteo_tsv, "_shard", lambda *_, w=worker: (w, 3))
        shards.append(c1_values(list(dataset)))
    assert sorted(v for shard in shards for v in shard) == list(range(31))
    for shard in shards:  # each reader holds one contiguous third of the file
        assert shard == list(range(shard[0], shard[0] + len(shard))) and 8 <= len(shard) <= 12


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


# ----- shared batch pieces -------------------------------------------------------------------------


def test_collate_supports_multi_id_and_empty_bags() -> None:
    samples = [
        ClickSample(dense=[1.0, 2.0], sparse=[[3], [1, 2, 5]], label=1.0),
        ClickSample(dense=[0.0, 0.5], sparse=[[4], []], label=0.0),
    ]
    batch = collate_click_samples(samples, ["a", "b"])
    assert batch.dense.shape == (2, 2) and batch.labels.tolist() == [1.0, 0.0]
    assert batch.sparse.lengths().tolist() == [1, 1, 3, 0]
    assert batch.sparse["b"].values().tolist() == [1, 2, 5]
    with pytest.raises(ValueError, match="bags"):
        kjt_from_id_lists(["a", "b"], [[[1], [2]], [[3]]])


# ----- synthetic ---------------------------------------------------------------------------------


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
