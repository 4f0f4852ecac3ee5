"""Reader of Criteo Display Advertising TSV files (plain or gzip), streamed in blocks into `ClickBatch` es.

Each line is ``label \\t I1..I13 \\t C1..C26``: a 0/1 label, 13 integer counts (possibly empty,
possibly negative) and 26 categorical values hashed to 8 hex digits (possibly empty). Dense
values become ``log(1 + max(x, 0))`` (empty → 0); a categorical value becomes
``int(hex, 16) % table_size`` (empty → 0), for ids of any length. Blank lines are skipped; a file
without data lines is an error. The files are read in blocks of whole lines (each reader only its
share, see `shards.py`) and parsed by `vectorised.py`, so a multi-GB day never has to
fit in memory; `parse_criteo_line` is the per-line parser for the blocks that one declines.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np
import torch
from torch.utils.data import IterableDataset

from comera_lightning.data.click_logs import ClickBatch, kjt_from_id_matrix
from comera_lightning.data.criteo.shards import (
    DEFAULT_BLOCK_BYTES,
    Block,
    FileShare,
    count_lines_before,
    distributed_rank,
    is_gzip,
    iter_blocks,
    reader_index,
    shares_of_reader,
)
from comera_lightning.data.criteo.vectorised import (
    NUM_COLUMNS,
    NUM_DENSE,
    NUM_SPARSE,
    ParsedBlock,
    log1p_dense,
    parse_block,
)
from comera_lightning.data.errors import empty_file_error

__all__ = [
    "CRITEO_CAT_NAMES",
    "CRITEO_INT_NAMES",
    "CRITEO_KAGGLE_TABLE_SIZES",
    "NUM_DENSE",
    "NUM_SPARSE",
    "CriteoIterableDataset",
    "parse_criteo_line",
]

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


def check_table_sizes(table_sizes: Sequence[int] | None) -> list[int]:
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
    if is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return open(path, encoding="utf-8", errors="replace", newline="\n")


def _is_blank(line: str) -> bool:
    """A blank line (only spaces or line ends) is skipped, wherever it is."""
    return line.isspace() and "\t" not in line


def _parse_lines(block: Block, sizes: np.ndarray) -> ParsedBlock:
    """The per-line path for a block the vectorised parser declined; errors name the file and line."""
    labels: list[int] = []
    dense: list[list[int]] = []
    hashes: list[list[int]] = []
    for index, line in enumerate(block.data.decode("utf-8", errors="replace").splitlines(keepends=True)):
        if _is_blank(line):
            continue
        try:
            label, ints, ids = parse_criteo_line(line)
        except ValueError:
            line_no = count_lines_before(block.path, block.offset) + index + 1
            parse_criteo_line(line, str(block.path), line_no)  # raises again, naming the file and line
            raise
        labels.append(label)
        dense.append(ints)
        hashes.append(ids)
    table = [int(s) for s in sizes]
    ids = [[0 if h < 0 else h % table[c] for c, h in enumerate(row)] for row in hashes]
    return ParsedBlock(
        labels=np.array(labels, dtype=np.float32),
        dense=log1p_dense(np.array(dense, dtype=np.float64).reshape(-1, NUM_DENSE)),
        ids=np.array(ids, dtype=np.int64).reshape(-1, NUM_SPARSE),
    )


def parse_any_block(block: Block, sizes: np.ndarray) -> ParsedBlock:
    """A block parsed by the vectorised parser, or line by line when it declines."""
    rows = parse_block(block.data, sizes)
    return _parse_lines(block, sizes) if rows is None else rows


def _has_data_line(path: Path) -> bool:
    """True if the file holds at least one non-blank line (reads up to the first one)."""
    with _open_text(path) as handle:
        return any(not _is_blank(line) for line in handle)


def click_batch(rows: ParsedBlock) -> ClickBatch:
    """A ClickBatch of parsed rows (ids already reduced modulo the table sizes); shares their memory."""
    return ClickBatch(
        dense=torch.from_numpy(rows.dense),
        sparse=kjt_from_id_matrix(CRITEO_CAT_NAMES, torch.from_numpy(rows.ids)),
        labels=torch.from_numpy(rows.labels),
    )


class CriteoIterableDataset(IterableDataset):
    """Streams ``ClickBatch`` es from Criteo TSV files (plain or gzip), in blocks of whole lines.

    The readers are the DataLoader workers of every DDP rank; each parses only its own share
    (`shards.shares_of_reader`): a byte range of every plain file, whole gzip files. So no
    line is parsed by two readers, and a reader reads no other reader's bytes except the tail of
    one line where its range starts. Blocks are parsed by the vectorised parser, or line by line
    when they hold something it declines (blank or CRLF lines, over-long fields, a bad line).
    Batches are built here: use ``DataLoader(dataset, batch_size=None)``. Ranks may get different
    numbers of batches (shares differ by up to a line per file, and whole gzip files differ in
    size); set ``drop_last`` and limit the batches per epoch when that matters.
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        batch_size: int,
        table_sizes: Sequence[int] | None = None,
        drop_last: bool = False,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        super().__init__()
        if not files:
            raise ValueError("CriteoIterableDataset needs at least one file, got none.")
        if batch_size <= 0 or block_bytes <= 0:
            raise ValueError(f"batch_size and block_bytes must be positive, got {batch_size} and {block_bytes}.")
        self.files = [Path(f) for f in files]
        self.batch_size = batch_size
        self.table_sizes = check_table_sizes(table_sizes)
        self.drop_last = drop_last
        self.block_bytes = block_bytes

    def __getstate__(self) -> dict:
        # Pickled for a spawned DataLoader worker: take this process's rank along.
        return {**self.__dict__, "_launching_rank": distributed_rank()}

    def shares(self) -> list[FileShare]:
        """What this reader owns: its byte range of every plain file and its whole gzip files."""
        reader, readers = reader_index(getattr(self, "_launching_rank", None))
        return shares_of_reader(self.files, reader, readers)

    def iter_blocks(self) -> Iterator[Block]:
        """The raw blocks of whole lines this reader owns, in reading order."""
        for share in self.shares():
            yield from self._share_blocks(share)

    def iter_parsed(self) -> Iterator[ParsedBlock]:
        """Parsed blocks of this reader's lines; a file without data lines is an error."""
        sizes = np.array(self.table_sizes, dtype=np.uint64)
        for share in self.shares():
            rows_in_share = 0
            for block in self._share_blocks(share):
                rows = parse_any_block(block, sizes)
                rows_in_share += len(rows)
                if len(rows):
                    yield rows
            if share.compressed and rows_in_share == 0:
                raise no_data_lines(share.path)

    def _share_blocks(self, share: FileShare) -> Iterator[Block]:
        # The reader of a plain file's first range checks that the file has data at all.
        if share.first_of_file and not share.compressed and not _has_data_line(share.path):
            raise no_data_lines(share.path)
        yield from iter_blocks(share, self.block_bytes)

    def __iter__(self) -> Iterator[ClickBatch]:
        pending: list[ParsedBlock] = []
        held = 0
        for rows in self.iter_parsed():
            pending.append(rows)
            held += len(rows)
            if held < self.batch_size:
                continue
            merged = concat_rows(pending)
            full = held - held % self.batch_size
            for begin in range(0, full, self.batch_size):
                yield click_batch(merged.slice(begin, begin + self.batch_size))
            pending, held = [merged.slice(full, held)], held - full
        if held and not self.drop_last:
            yield click_batch(concat_rows(pending))


def concat_rows(blocks: list[ParsedBlock]) -> ParsedBlock:
    """One block holding the rows of ``blocks`` in order."""
    if len(blocks) == 1:
        return blocks[0]
    return ParsedBlock(*(np.concatenate([getattr(b, name) for b in blocks]) for name in ("labels", "dense", "ids")))


def no_data_lines(path: Path) -> ValueError:
    """The error for a Criteo file without a data line."""
    return empty_file_error(path, f"one Criteo line per example ({NUM_COLUMNS} tab-separated columns)")
