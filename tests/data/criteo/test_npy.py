"""Criteo days converted once to .npy folders: same batches as the TSV reader, rows split over readers, bad input refused."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.criteo import CriteoDataModule  # noqa: E402
from comera_lightning.data.criteo import npy as criteo_npy  # noqa: E402
from comera_lightning.data.criteo.npy import CriteoNpyDataset, convert_criteo_day, is_converted_day  # noqa: E402
from comera_lightning.data.criteo.tsv import CriteoIterableDataset  # noqa: E402

SIZES = [997] * 26


def line(index: int, rng: random.Random) -> str:
    ints = [rng.choice(["", str(rng.randint(0, 5000)), "-1"]) for _ in range(13)]
    ids = [rng.choice(["", f"{rng.getrandbits(32):08x}"]) for _ in range(25)]
    return "\t".join([str(index % 2), *ints, f"{index:08x}", *ids])


@pytest.fixture
def days(tmp_path: Path) -> list[Path]:
    rng = random.Random(0)
    plain = tmp_path / "day_0"
    plain.write_text("".join(line(i, rng) + "\n" for i in range(130)) + "\n")  # a blank line at the end too
    packed = tmp_path / "day_1.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write("".join(line(i, rng) + "\n" for i in range(130, 201)))
    return [plain, packed]


def rows(batches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.cat([torch.stack([b.sparse[f"cat_{c}"].values() for c in range(26)], 1) for b in batches])
    return torch.cat([b.dense for b in batches]), ids, torch.cat([b.labels for b in batches])


def test_converted_days_give_the_tsv_readers_batches(days: list[Path], tmp_path: Path) -> None:
    folders = [convert_criteo_day(day, tmp_path / "npy", SIZES) for day in days]
    assert [f.name for f in folders] == ["day_0", "day_1"] and all(is_converted_day(f) for f in folders)
    assert not list((tmp_path / "npy").rglob("*.part")) and not list((tmp_path / "npy").rglob("*.tmp"))
    tsv = list(CriteoIterableDataset(days, 32, SIZES))
    npy = list(CriteoNpyDataset(folders, 32, SIZES))
    assert [b.batch_size for b in npy] == [b.batch_size for b in tsv] == [32] * 6 + [9]
    for ours, theirs in zip(rows(npy), rows(tsv)):
        assert torch.equal(ours, theirs)
    assert [b.batch_size for b in CriteoNpyDataset(folders, 32, SIZES, drop_last=True)] == [32] * 6


@pytest.mark.parametrize("readers", [2, 3, 7])
def test_each_reader_reads_its_own_rows_of_every_day(days, tmp_path, monkeypatch, readers) -> None:
    folders = [convert_criteo_day(day, tmp_path / "npy", SIZES) for day in days]
    seen = []
    for reader in range(readers):
        monkeypatch.setattr(criteo_npy, "reader_index", lambda *_, r=reader: (r, readers))
        dataset = CriteoNpyDataset(folders, 16, SIZES)
        spans = dataset.row_ranges()
        assert [(d.name, end - start) for d, start, end in spans] == [
            ("day_0", 130 * (reader + 1) // readers - 130 * reader // readers),
            ("day_1", 71 * (reader + 1) // readers - 71 * reader // readers)]
        seen += rows(list(dataset))[1][:, 0].tolist()  # C1 = the line index (< 997)
    assert sorted(seen) == sorted(i % 997 for i in range(201))


def test_datamodule_reads_converted_days_and_refuses_mixes_and_other_sizes(days, tmp_path) -> None:
    folder = convert_criteo_day(days[0], tmp_path / "npy", SIZES)
    dm = CriteoDataModule(train_files=[str(folder)], val_files=str(days[1]), batch_size=50, table_sizes=SIZES)
    dm.setup("fit")
    assert [b.batch_size for b in dm.train_dataloader()] == [50, 50, 30]
    assert [b.batch_size for b in dm.val_dataloader()] == [50, 21]
    with pytest.raises(ValueError, match="train_files mixes TSV files and converted days"):
        CriteoDataModule(train_files=[str(folder), str(days[1])], table_sizes=SIZES).setup("fit")
    with pytest.raises(ValueError, match=r"converted with table_sizes \[997.*convert the TSV again"):
        CriteoNpyDataset([folder], 8, [1000] * 26)
    with pytest.raises(FileNotFoundError, match="not a converted Criteo day"):
        CriteoNpyDataset([tmp_path], 8, SIZES)


def test_a_bad_line_stops_the_conversion_naming_it_and_leaves_no_finished_folder(tmp_path) -> None:
    bad = tmp_path / "day_9"
    bad.write_text(line(0, random.Random(1)) + "\n1\tnot-a-line\n")
    with pytest.raises(ValueError, match=r"day_9, line 2: expected 40 tab-separated columns"):
        convert_criteo_day(bad, tmp_path / "npy", SIZES)
    assert not is_converted_day(tmp_path / "npy" / "day_9")


def test_conversion_refuses_to_write_over_a_file_of_the_folder_name(tmp_path) -> None:
    plain = tmp_path / "day_3"
    plain.write_text(line(0, random.Random(1)) + "\n")
    gz = tmp_path / "day_3.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(FileExistsError, match=r"writes the folder .*day_3, but a file of that name is there"):
        convert_criteo_day(gz, tmp_path, SIZES)
    assert plain.read_text() == line(0, random.Random(1)) + "\n"


def test_command_line_converts_and_writes_meta(days, tmp_path, capsys) -> None:
    criteo_npy.main([str(days[1]), "--out", str(tmp_path / "out"), "--table_sizes", *map(str, SIZES)])
    meta = json.loads((tmp_path / "out" / "day_1" / "meta.json").read_text())
    assert meta == {"rows": 71, "table_sizes": SIZES, "source": "day_1.gz"}
    assert "day_1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        criteo_npy.main([str(tmp_path / "day_7.gz"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "error:" in err and "day_7.gz" in err and "Traceback" not in err
