"""The Criteo TSV reader: parsing, malformed lines named by file and line, blank lines, files streamed in turn, worker shares."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.click_logs import ClickBatch  # noqa: E402
from comera_lightning.data.criteo import CRITEO_CAT_NAMES  # noqa: E402
from comera_lightning.data.criteo import tsv as criteo_tsv  # noqa: E402
from comera_lightning.data.criteo.tsv import CriteoIterableDataset, parse_criteo_line  # noqa: E402
from tests.helpers.criteo_lines import SMALL_SIZES, make_line, write_lines  # noqa: E402


def c1_values(batches: list[ClickBatch]) -> list[int]:
    """The C1 ids of every row, in order (with table size 2**31, C1 = the line index)."""
    return [v for b in batches for v in b.sparse["cat_0"].values().tolist()]


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
        ("1", "got 1"),  # (a blank line is skipped: see the blank-line tests below)
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
        monkeypatch.setattr(criteo_tsv, "reader_index", lambda *_, w=worker: (w, 3))
        shards.append(c1_values(list(dataset)))
    assert sorted(v for shard in shards for v in shard) == list(range(31))
    for shard in shards:  # each reader holds one contiguous third of the file
        assert shard == list(range(shard[0], shard[0] + len(shard))) and 8 <= len(shard) <= 12


SIZES = [1000] * 26


def criteo_line(index: int, c1: str | None = None, i1: str | None = None) -> str:
    ints = [i1 if i1 is not None else str(index)] + [str(k) for k in range(12)]
    cats = [c1 if c1 is not None else f"{index:08x}"] + [f"{(index * 7919 + k) % 2**32:08x}" for k in range(25)]
    return "\t".join(["1", *ints, *cats])


def criteo_batches(path: Path, batch_size: int = 2) -> list:
    return list(CriteoIterableDataset([path], batch_size=batch_size, table_sizes=SIZES))


@pytest.mark.parametrize("hex_id", ["1" + "0" * 16, "f" * 16, "abcdef0123456789abcdef"])
def test_criteo_long_hex_id_is_reduced_like_any_id(tmp_path: Path, hex_id: str) -> None:
    path = tmp_path / "day_0.txt"
    path.write_text("".join(criteo_line(i, c1=hex_id if i == 1 else None) + "\n" for i in range(3)))
    batches = criteo_batches(path)
    ids = [v for b in batches for v in b.sparse["cat_0"].values().tolist()]
    assert ids == [0, int(hex_id, 16) % 1000, 2]


def test_criteo_overlong_integer_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "day_1.txt"
    path.write_text("".join(criteo_line(i, i1="9" * 400 if i == 2 else None) + "\n" for i in range(4)))
    with pytest.raises(ValueError, match=r"day_1\.txt, line 3: integer column I1 holds a 400-character integer"):
        criteo_batches(path)


def test_criteo_huge_integer_that_fits_float64_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "day_2.txt"
    path.write_text("".join(criteo_line(i, i1="9" * 305 if i == 0 else None) + "\n" for i in range(2)))
    (batch,) = criteo_batches(path)
    assert torch.isfinite(batch.dense).all() and batch.dense[0, 0] > 700


@pytest.mark.parametrize("compress", [False, True])
def test_criteo_blank_lines_are_skipped(tmp_path: Path, compress: bool) -> None:
    lines = [criteo_line(i) for i in range(5)]
    clean = tmp_path / "clean.txt"
    clean.write_text("".join(line + "\n" for line in lines))
    blank = tmp_path / ("blank.txt.gz" if compress else "blank.txt")
    text = "\n" + lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n  \r\n\n"
    with (gzip.open(blank, "wt") if compress else open(blank, "w")) as handle:
        handle.write(text)
    expected, got = criteo_batches(clean), criteo_batches(blank)
    assert len(got) == len(expected) == 3
    for a, b in zip(expected, got):
        assert torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse.values(), b.sparse.values())


def test_criteo_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "day_3.txt"
    path.write_text(criteo_line(0) + "\n\n" + "1\tbad\n")
    with pytest.raises(ValueError, match=r"day_3\.txt, line 3: expected 40 tab-separated columns"):
        criteo_batches(path)


@pytest.mark.parametrize("text", ["", "\n \n"])
def test_criteo_empty_file_is_an_error(tmp_path: Path, text: str) -> None:
    good = tmp_path / "day_0.txt"
    good.write_text(criteo_line(0) + "\n")
    empty = tmp_path / "day_1.txt"
    empty.write_text(text)
    dataset = CriteoIterableDataset([good, empty], batch_size=4, table_sizes=SIZES)
    with pytest.raises(ValueError, match=r"day_1\.txt: line 1: the file holds no data lines"):
        list(dataset)
