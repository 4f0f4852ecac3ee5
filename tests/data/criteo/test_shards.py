"""Criteo reading at scale: byte-range shares that tile every file, whole gzip files, the vectorised parser."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchrec")  # the click-log data and the DLRM are built on TorchRec

from comera_lightning.data.criteo import tsv as criteo_tsv  # noqa: E402
from comera_lightning.data.criteo.shards import Block, iter_blocks, shares_of_reader  # noqa: E402
from comera_lightning.data.criteo.tsv import CriteoIterableDataset, _parse_lines  # noqa: E402
from comera_lightning.data.criteo.vectorised import parse_block  # noqa: E402
from tests.helpers.paths import SCRIPTS  # noqa: E402

WIDE = [2**31] * 26


def criteo_line(index: int, rng: random.Random | None = None) -> str:
    """A valid line whose C1 is ``index``; with ``rng``, random empties, negatives and id lengths."""
    if rng is None:
        return "\t".join(["1", *[str(k) for k in range(13)], f"{index:08x}", *["abcdef01"] * 25])
    ints = [rng.choice(["", str(rng.randint(0, 10**rng.randint(1, 15) - 1)), f"-{rng.randint(1, 99)}"]) for _ in range(13)]
    ids = ["".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randint(0, 16))) for _ in range(25)]
    return "\t".join([str(rng.randint(0, 1)), *ints, f"{index:x}", *ids])


def c1_of(dataset: CriteoIterableDataset) -> list[int]:
    return [v for batch in dataset for v in batch.sparse["cat_0"].values().tolist()]


def blocks_of_reader(files: list[Path], reader: int, readers: int, block_bytes: int) -> list[Block]:
    return [b for share in shares_of_reader(files, reader, readers) for b in iter_blocks(share, block_bytes)]


@pytest.mark.parametrize("readers", [1, 2, 3, 5, 64])
def test_reader_shares_tile_every_plain_file_without_overlap(tmp_path: Path, readers: int) -> None:
    rng = random.Random(readers)
    first = tmp_path / "day_0.txt"
    first.write_text("".join(criteo_line(i, rng) + "\n" for i in range(40)))
    second = tmp_path / "day_1.txt"  # no newline at the end, a blank line and a CRLF line inside
    second.write_text("\n".join([criteo_line(40, rng), "", criteo_line(41, rng) + "\r", criteo_line(42, rng)]))
    files = [first, second]
    per_reader = [blocks_of_reader(files, r, readers, block_bytes=64) for r in range(readers)]
    for path in files:
        spans = sorted((b.offset, b.offset + len(b.data)) for blocks in per_reader for b in blocks if b.path == path)
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert spans[-1][1] in (path.stat().st_size, path.stat().st_size + 1)  # +1: the newline added at EOF
    seen = []
    for reader in range(readers):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(criteo_tsv, "reader_index", lambda *_, r=reader: (r, readers))
            seen.append(c1_of(CriteoIterableDataset(files, batch_size=7, table_sizes=WIDE, block_bytes=64)))
    assert sorted(v for values in seen for v in values) == list(range(43))


def test_gzip_files_go_whole_to_one_reader_each(tmp_path: Path) -> None:
    files = []
    for day in range(3):
        path = tmp_path / f"day_{day}.gz"
        with gzip.open(path, "wt") as handle:
            handle.write("".join(criteo_line(10 * day + i) + "\n" for i in range(5)))
        files.append(path)
    owners = [[s.path.name for s in shares_of_reader(files, r, 2)] for r in range(2)]
    assert owners == [["day_0.gz", "day_2.gz"], ["day_1.gz"]]
    with pytest.raises(ValueError, match=r"3 gzip file\(s\) cannot be shared by 4 readers.*gunzip -k"):
        shares_of_reader(files, 0, 4)


def test_vectorised_parser_matches_the_per_line_parser() -> None:
    rng = random.Random(0)
    for trial in range(40):
        data = "".join(criteo_line(rng.randint(0, 2**40), rng) + "\n" for _ in range(rng.randint(1, 60))).encode()
        sizes = np.array([rng.randint(1, 10**12) for _ in range(26)], dtype=np.uint64)
        fast = parse_block(data, sizes)
        slow = _parse_lines(Block(Path("day.txt"), 0, data), sizes)
        assert fast is not None, trial
        for name in ("labels", "dense", "ids"):
            assert np.array_equal(getattr(fast, name), getattr(slow, name)), (trial, name)


@pytest.mark.parametrize(
    "line",
    ["1\t2", "1" + "\t1" * 12 + "\t" + "9" * 16 + "\t" * 26, "2" + "\t" * 39, "1\t-" + "\t" * 38, "1" + "\t" * 39 + "\r"],
    ids=["short", "16-digit-int", "bad-label", "lone-minus", "crlf"],
)
def test_vectorised_parser_leaves_what_it_cannot_decode_exactly_to_the_line_parser(line: str) -> None:
    sizes = np.ones(26, dtype=np.uint64)
    assert parse_block(("1" + "\t" * 39 + "\n").encode(), sizes) is not None  # all fields empty: fine
    assert parse_block((line + "\n").encode(), sizes) is None


def test_every_line_is_read_by_one_rank_and_worker_of_two_gloo_processes(tmp_path: Path) -> None:
    files = [tmp_path / "day_0.txt", tmp_path / "day_1.txt"]
    files[0].write_text("".join(criteo_line(i) + "\n" for i in range(300)))
    files[1].write_text("".join(criteo_line(i) + "\n" for i in range(300, 457)))
    cmd = [sys.executable, str(SCRIPTS / "criteo_ranks_script.py"), str(tmp_path), *map(str, files)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    ids = [v for run in runs for values in run["ids"].values() for v in values]
    assert sorted(ids) == list(range(457))  # each line parsed exactly once over 2 ranks × 2 workers
    assert all(len(run["ids"]) == 2 and all(run["ids"].values()) for run in runs)  # every reader had a share
    for path in files:
        spans = sorted(tuple(s[1:]) for run in runs for s in run["blocks"] if s[0] == path.name)
        assert spans[0][0] == 0 and spans[-1][1] == path.stat().st_size
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # the blocks tile the file: no byte parsed twice
