"""Reader of Criteo Display Advertising TSV files (plain or gzip), streamed line by line into `ClickBatch` es.

Each line is ``label \\t I1..I13 \\t C1..C26``: a 0/1 label, 13 integer counts (possibly empty,
possibly negative) and 26 categorical values hashed to 8 hex digits (possibly empty). Dense
values become ``log(1 + max(x, 0))`` (empty → 0); a categorical value becomes
``int(hex, 16) % table_size`` (empty → 0), for ids of any length. Blank lines are skipped; a file
without data lines is an error. The files are read line by line, so a multi-GB day
never has to fit in memory.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import torch
from torch import Tensor
from torch.utils.data import IterableDataset, get_worker_info

from comera_lightning.data.click_logs import ClickBatch, kjt_from_id_matrix
from comera_lightning.data.file_errors import empty_file_error

__all__ = [
    "CRITEO_CAT_NAMES",
    "CRITEO_INT_NAMES",
    "CRITEO_KAGGLE_TABLE_SIZES",
    "NUM_DENSE",
    "NUM_SPARSE",
    "CriteoIterableDataset",
    "parse_criteo_line",
]

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE
# Same names as torchrec.datasets.criteo.DEFAULT_CAT_NAMES.
CRITEO_CAT_NAMES: list[str] = [f"cat_{i}" for i in range(NUM_SPARSE)]
CRITEO_INT_NAMES: list[str] = [f"int_{i}" for i in range(NUM_DENSE)]
# Distinct values per categorical column of the Criteo Kaggle (Display Advertising Challenge)
# training set, as used by the DLRM reference (facebookresearch/dlrm, ln_emb for Kaggle) and
# the TorchRec DLRM example's --num_embeddings_per_feature; 33,762,577 rows in total.
CRITEO_KAGGLE_TABLE_SIZES: list[int] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip

_DENSE_RE = re.compile(r"(?:-?[0-9]+)?")
_HEX_RE = re.compile(r"[0-9a-fA-F]*")
_LINE_RE = re.compile(
    "([01])" + f"\t({_DENSE_RE.pattern})" * NUM_DENSE + f"\t({_HEX_RE.pattern})" * NUM_SPARSE
)
# The fast path: integers of at most 300 digits always convert to float64; longer ones are checked.
_SHORT_DENSE = r"(?:-?[0-9]{1,300})?"
_FAST_LINE_RE = re.compile(
    "([01])" + f"\t({_SHORT_DENSE})" * NUM_DENSE + f"\t({_HEX_RE.pattern})" * NUM_SPARSE
)


def _check_table_sizes(table_sizes: Sequence[int] | None) -> list[int]:
    """The 26 table sizes to use (Kaggle's by default), validated."""
    sizes = list(CRITEO_KAGGLE_TABLE_SIZES if table_sizes is None else table_sizes)
    if len(sizes) != NUM_SPARSE or any(int(s) < 1 for s in sizes):
        raise ValueError(
            f"table_sizes must be {NUM_SPARSE} positive integers (one per categorical column), got {sizes}."
        )
    return [int(s) for s in sizes]


def parse_criteo_line(line: str, path: str = "<string>", line_no: int = 0) -> tuple[int, list[int], list[int]]:
    """Split one Criteo line into (label, 13 raw ints, 26 raw hashes); empty ints give 0, empty ids -1.

    Raises ``ValueError`` naming ``path``, ``line_no`` and the problem for a malformed line.
    """
    text = line.rstrip("\r\n")
    match = _FAST_LINE_RE.fullmatch(text)
    if match is None:
        match = _LINE_RE.fullmatch(text)
        if match is None:
            raise ValueError(f"{path}, line {line_no}: {_line_problem(text)}")
        _check_long_integers(match.groups()[1 : 1 + NUM_DENSE], path, line_no)
    groups = match.groups()
    dense = [int(v) if v else 0 for v in groups[1 : 1 + NUM_DENSE]]
    sparse = [int(v, 16) if v else -1 for v in groups[1 + NUM_DENSE :]]
    return int(groups[0]), dense, sparse


def _check_long_integers(values: Sequence[str], path: str, line_no: int) -> None:
    """Raise naming the file and line if an integer column is too long for Python or float64."""
    for column, value in enumerate(values, start=1):
        try:
            if value:
                float(int(value))
        except (ValueError, OverflowError) as err:
            raise ValueError(
                f"{path}, line {line_no}: integer column I{column} holds a {len(value)}-character integer, "
                f"too large to use ({err}); fix or drop the line."
            ) from err


def _line_problem(text: str) -> str:
    """Describe why ``text`` is not a valid Criteo line (slow path, only for bad lines)."""
    fields = text.split("\t")
    if len(fields) != NUM_COLUMNS:
        hint = ""
        if len(fields) == NUM_COLUMNS - 1:
            hint = " (Criteo Kaggle's test.txt has no label column; use a labelled split)"
        return (
            f"expected {NUM_COLUMNS} tab-separated columns (label, {NUM_DENSE} integers, "
            f"{NUM_SPARSE} hex ids), got {len(fields)}{hint}."
        )
    if fields[0] not in ("0", "1"):
        return f"the label must be 0 or 1, got {fields[0]!r}."
    for column, value in enumerate(fields[1 : 1 + NUM_DENSE], start=1):
        if not _DENSE_RE.fullmatch(value):
            return f"integer column I{column} holds {value!r}, not an integer."
    for column, value in enumerate(fields[1 + NUM_DENSE :], start=1):
        if not _HEX_RE.fullmatch(value):
            return f"categorical column C{column} holds {value!r}, not a hex id."
    return "malformed line."  # pragma: no cover - the checks above mirror _LINE_RE


def _open_text(path: Path) -> IO[str]:
    """Open a text file for reading, transparently gunzipping (detected by magic bytes)."""
    with open(path, "rb") as handle:
        magic = handle.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return open(path, encoding="utf-8", errors="replace", newline="\n")


def _batch_from_rows(labels: list[int], dense: list[int], sparse: list[int], sizes: Tensor) -> ClickBatch:
    """Tensorise flat row-major rows: log1p(max(x, 0)) dense, ids modulo the table sizes (empty → 0)."""
    batch = len(labels)
    dense_t = torch.tensor(dense, dtype=torch.float64).view(batch, NUM_DENSE)
    try:
        raw = torch.tensor(sparse, dtype=torch.int64).view(batch, NUM_SPARSE)
    except (ValueError, OverflowError, RuntimeError):  # a hex id beyond 64 bits: reduce it in Python
        raw = _reduced_ids(sparse, sizes).view(batch, NUM_SPARSE)
    ids = torch.where(raw < 0, torch.zeros_like(raw), raw.remainder(sizes))
    return ClickBatch(
        dense=dense_t.clamp_min_(0).log1p_().to(torch.float32),
        sparse=kjt_from_id_matrix(CRITEO_CAT_NAMES, ids),
        labels=torch.tensor(labels, dtype=torch.float32),
    )


def _reduced_ids(sparse: list[int], sizes: Tensor) -> Tensor:
    """``id % table size`` computed on Python ints (any length), empty ids (-1) kept; the slow path."""
    table = sizes.tolist()
    return torch.tensor(
        [h if h < 0 else h % table[i % NUM_SPARSE] for i, h in enumerate(sparse)], dtype=torch.int64
    )


def _shard() -> tuple[int, int]:
    """(this reader's index, number of readers) over DDP ranks × DataLoader workers."""
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * workers + worker, world * workers


class CriteoIterableDataset(IterableDataset):
    """Streams ``ClickBatch`` es from Criteo TSV files (plain or gzip), line by line.

    Line ``k`` (counted over all files, in order) goes to reader ``k % num_readers``, where
    the readers are the DataLoader workers of every DDP rank, so each line is read by
    exactly one of them. Batches are built here: use ``DataLoader(dataset, batch_size=None)``.
    Under DDP the ranks may get different numbers of batches (the last one can be short or
    missing); set ``drop_last`` and limit the batches per epoch when that matters.
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        batch_size: int,
        table_sizes: Sequence[int] | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if not files:
            raise ValueError("CriteoIterableDataset needs at least one file, got none.")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}.")
        self.files = [Path(f) for f in files]
        self.batch_size = batch_size
        self.table_sizes = _check_table_sizes(table_sizes)
        self.drop_last = drop_last

    def iter_rows(self) -> Iterator[tuple[int, list[int], list[int]]]:
        """Parsed (label, raw ints, raw hashes) of the lines this reader owns."""
        reader, readers = _shard()
        global_line = 0
        for path in self.files:
            start = global_line
            with _open_text(path) as handle:
                for line_no, line in enumerate(handle, start=1):
                    if line.isspace() and "\t" not in line:  # blank: skipped, not counted for sharding
                        continue
                    owned = global_line % readers == reader
                    global_line += 1
                    if owned:
                        yield parse_criteo_line(line, str(path), line_no)
            if global_line == start:
                raise empty_file_error(path, f"one Criteo line per example ({NUM_COLUMNS} tab-separated columns)")

    def __iter__(self) -> Iterator[ClickBatch]:
        sizes = torch.tensor(self.table_sizes, dtype=torch.int64)
        labels: list[int] = []
        dense: list[int] = []
        sparse: list[int] = []
        for label, ints, hashes in self.iter_rows():
            labels.append(label)
            dense.extend(ints)
            sparse.extend(hashes)
            if len(labels) == self.batch_size:
                yield _batch_from_rows(labels, dense, sparse, sizes)
                labels, dense, sparse = [], [], []
        if labels and not self.drop_last:
            yield _batch_from_rows(labels, dense, sparse, sizes)
