"""Criteo days converted once to ``.npy`` arrays, and read back memory-mapped: for many epochs over the same days.

`convert_criteo_day` parses a TSV day (plain or gzip) with the vectorised reader and writes a
folder holding ``dense.npy`` (float32, ``log1p(max(x, 0))``), ``sparse.npy`` (int64 ids, already
modulo the table sizes), ``labels.npy`` (float32) and ``meta.json`` (rows, table sizes). The layout
is TorchRec's ``tsv_to_npys`` one (its dense transform differs). `CriteoNpyDataset` maps those
arrays and gives each rank × DataLoader worker a contiguous range of rows of every day, so no row
is read by two readers. From the command line::

    python -m comera_lightning.data.criteo.npy day_0.gz day_1.gz --out criteo_npy [--table_sizes ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from torch.utils.data import IterableDataset

from comera_lightning.data.click_logs import ClickBatch
from comera_lightning.data.criteo.shards import distributed_rank, iter_blocks, reader_index, shares_of_reader
from comera_lightning.data.criteo.tsv import (
    check_table_sizes,
    click_batch,
    concat_rows,
    no_data_lines,
    parse_any_block,
)
from comera_lightning.data.criteo.vectorised import ParsedBlock

__all__ = ["ARRAYS", "CriteoNpyDataset", "convert_criteo_day", "is_converted_day"]

ARRAYS = ("dense", "sparse", "labels")
_FIELDS = {"dense": "dense", "sparse": "ids", "labels": "labels"}  # file name -> ParsedBlock field
META = "meta.json"


def is_converted_day(path: str | Path) -> bool:
    """True for a folder written by `convert_criteo_day`."""
    return (Path(path) / META).is_file()


def convert_criteo_day(tsv: str | Path, out: str | Path, table_sizes: Sequence[int] | None = None) -> Path:
    """Parse one Criteo TSV day into ``out/<name>/`` (see the module docstring); returns that folder.

    The arrays are written through ``.part`` files and renamed at the end, so an interrupted
    conversion never leaves a folder that looks complete.
    """
    tsv = Path(tsv)
    sizes = check_table_sizes(table_sizes)
    folder = Path(out) / tsv.name.removesuffix(".gz")
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"convert_criteo_day writes the folder {folder}, but a file of that name is there "
                              "(the decompressed day?); give another output folder (--out).")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / META).unlink(missing_ok=True)
    parts = {name: folder / f"{name}.npy.part" for name in ARRAYS}
    rows = 0
    handles = {name: open(path, "wb") for name, path in parts.items()}
    try:
        for block in _whole_file_blocks(tsv, sizes):
            for name in ARRAYS:
                handles[name].write(np.ascontiguousarray(getattr(block, _FIELDS[name])).tobytes())
            rows += len(block)
    finally:
        for handle in handles.values():
            handle.close()
    shapes = {"dense": (rows, 13), "sparse": (rows, 26), "labels": (rows,)}
    dtypes = {"dense": np.float32, "sparse": np.int64, "labels": np.float32}
    for name in ARRAYS:
        _write_npy(folder / f"{name}.npy", parts[name], shapes[name], dtypes[name])
    (folder / META).write_text(json.dumps({"rows": rows, "table_sizes": sizes, "source": tsv.name}))
    return folder


def _whole_file_blocks(tsv: Path, sizes: list[int]) -> Iterator[ParsedBlock]:
    """Every parsed block of ``tsv``: this process reads the whole file, whatever its rank."""
    table = np.array(sizes, dtype=np.uint64)
    for share in shares_of_reader([tsv], 0, 1):
        rows = 0
        for block in iter_blocks(share):
            parsed = parse_any_block(block, table)
            rows += len(parsed)
            yield parsed
        if rows == 0:
            raise no_data_lines(tsv)


def _write_npy(path: Path, raw: Path, shape: tuple[int, ...], dtype: type) -> None:
    """``raw`` bytes behind an ``.npy`` header, renamed into place; ``raw`` removed."""
    with open(path.with_suffix(".npy.tmp"), "wb") as out, open(raw, "rb") as source:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(out, header)
        shutil.copyfileobj(source, out, 1 << 24)
    path.with_suffix(".npy.tmp").replace(path)
    raw.unlink()


class CriteoNpyDataset(IterableDataset):
    """``ClickBatch`` es from converted days, memory-mapped; each reader gets a contiguous row range of every day."""

    def __init__(self, days: Sequence[str | Path], batch_size: int, table_sizes: Sequence[int] | None = None,
                 drop_last: bool = False) -> None:
        super().__init__()
        if not days or batch_size <= 0:
            raise ValueError(f"CriteoNpyDataset needs days and a positive batch_size, got {list(days)} and {batch_size}.")
        self.days = [Path(d) for d in days]
        self.batch_size, self.drop_last = batch_size, drop_last
        sizes = check_table_sizes(table_sizes)
        for day in self.days:
            _check_converted(day, sizes)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_launching_rank": distributed_rank()}

    def row_ranges(self) -> list[tuple[Path, int, int]]:
        """(day, first row, end row) of every day for this reader."""
        reader, readers = reader_index(getattr(self, "_launching_rank", None))
        ranges = []
        for day in self.days:
            rows = json.loads((day / META).read_text())["rows"]
            ranges.append((day, rows * reader // readers, rows * (reader + 1) // readers))
        return ranges

    def __iter__(self) -> Iterator[ClickBatch]:
        carry: ParsedBlock | None = None  # fewer than batch_size rows left over from the previous day
        for day, position, end in self.row_ranges():
            rows = _mapped_day(day)
            if carry is not None:
                take = min(self.batch_size - len(carry), end - position)
                carry = concat_rows([carry, _copied(rows.slice(position, position + take))])
                position += take
                if len(carry) < self.batch_size:
                    continue
                yield click_batch(carry)
                carry = None
            while end - position >= self.batch_size:
                yield click_batch(_copied(rows.slice(position, position + self.batch_size)))
                position += self.batch_size
            if position < end:
                carry = _copied(rows.slice(position, end))
        if carry is not None and not self.drop_last:
            yield click_batch(carry)


def _mapped_day(day: Path) -> ParsedBlock:
    """The day's arrays, memory-mapped read-only."""
    return ParsedBlock(**{_FIELDS[name]: np.load(day / f"{name}.npy", mmap_mode="r") for name in ARRAYS})


def _copied(rows: ParsedBlock) -> ParsedBlock:
    """Rows read into memory (tensors cannot share a read-only map)."""
    return ParsedBlock(np.array(rows.labels), np.array(rows.dense), np.array(rows.ids))


def _check_converted(day: Path, sizes: list[int]) -> None:
    """Refuse a folder that is not a finished conversion, or one made for other table sizes."""
    if not is_converted_day(day):
        raise FileNotFoundError(f"{day} is not a converted Criteo day (no {META}); run convert_criteo_day on the TSV.")
    made_for = json.loads((day / META).read_text())["table_sizes"]
    if made_for != sizes:
        raise ValueError(
            f"{day} was converted with table_sizes {made_for} (ids are stored modulo them), not {sizes}; "
            "convert the TSV again with these sizes, or use the sizes it was made with."
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m comera_lightning.data.criteo.npy",
                                     description="Convert Criteo TSV days (plain or gzip) to memory-mappable .npy folders.")
    parser.add_argument("days", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table_sizes", type=int, nargs=26, default=None, metavar="SIZE", help="26 sizes (default: Criteo Kaggle's)")
    args = parser.parse_args(argv)
    log = logging.getLogger(__name__)
    said = logging.StreamHandler(sys.stdout)  # each folder written, on stdout, whatever the logging set up elsewhere
    log.addHandler(said)
    log.setLevel(logging.INFO)
    try:
        for day in args.days:
            try:
                log.info("%s", convert_criteo_day(day, args.out, args.table_sizes))
            except (OSError, ValueError) as err:  # a bad line, a missing file, an output in the way: one line, no traceback
                parser.error(str(err))
    finally:
        log.removeHandler(said)


if __name__ == "__main__":
    main()
