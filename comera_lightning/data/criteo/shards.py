"""Which bytes of which Criteo files a reader owns, and reading them as blocks of whole lines.

A reader is one DataLoader worker of one rank. A plain file is cut into as many byte ranges as
there are readers, and a line belongs to the range holding its first byte; a reader finds its first
line by reading on from one byte before its range to the next newline (the tail of the line that
the previous reader owns, at most one line), then reads whole lines up to its range end. A gzip
file cannot be entered mid-stream, so it goes whole to one reader; with fewer gzip files than
readers the reader refuses to start rather than have every reader decompress every line.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from torch.utils.data import get_worker_info

__all__ = ["Block", "FileShare", "count_lines_before", "distributed_rank", "is_gzip", "iter_blocks", "reader_index", "shares_of_reader"]

DEFAULT_BLOCK_BYTES = 1 << 18  # 256 KiB: ~1,000 Criteo lines; larger blocks parse slower (cache)


@dataclass(frozen=True)
class FileShare:
    """The lines of ``path`` whose first byte lies in ``[start, end)``; a gzip file is always whole."""

    path: Path
    start: int
    end: int
    compressed: bool

    @property
    def first_of_file(self) -> bool:
        """True for the share holding the file's first line (its reader checks the file has data)."""
        return self.start == 0


@dataclass(frozen=True)
class Block:
    """Whole lines of one file, starting at byte ``offset`` (of the decompressed text for gzip)."""

    path: Path
    offset: int
    data: bytes


def is_gzip(path: Path) -> bool:
    """True when the file starts with gzip's magic bytes (whatever its name)."""
    with open(path, "rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


def shares_of_reader(files: Sequence[Path], reader: int, readers: int) -> list[FileShare]:
    """The shares of reader ``reader`` of ``readers``: its byte range of every plain file, its whole gzip files."""
    compressed = [path for path in files if is_gzip(path)]
    if readers > 1 and 0 < len(compressed) < readers:
        raise ValueError(
            f"{len(compressed)} gzip file(s) cannot be shared by {readers} readers (ranks × DataLoader workers) "
            "without each reader decompressing lines the others read: a gzip stream cannot be entered mid-way. "
            "Decompress them once (gunzip -k), give at least as many files as readers, or lower num_workers."
        )
    shares = []
    for path in files:
        if path in compressed:
            if compressed.index(path) % readers == reader:
                shares.append(FileShare(path, 0, -1, compressed=True))
            continue
        size = path.stat().st_size
        start, end = size * reader // readers, size * (reader + 1) // readers
        if start < end or reader == 0:  # reader 0 always has one: it checks the file holds data
            shares.append(FileShare(path, start, end, compressed=False))
    return shares


def iter_blocks(share: FileShare, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Iterator[Block]:
    """The share's lines in blocks of about ``block_bytes``, each ending at a newline (one is added at EOF)."""
    if share.compressed:
        with gzip.open(share.path, "rb") as handle:
            yield from _blocks(handle, share.path, 0, None, block_bytes)
        return
    with open(share.path, "rb") as handle:
        begin = _next_line_start(handle, share.start)
        stop = _next_line_start(handle, share.end)
        handle.seek(begin)
        yield from _blocks(handle, share.path, begin, stop, block_bytes)


def _next_line_start(handle: BinaryIO, position: int) -> int:
    """The first line start at or after ``position`` (reads the rest of the line ``position - 1`` is in)."""
    if position == 0:
        return 0
    handle.seek(position - 1)
    handle.readline()
    return handle.tell()


def _blocks(handle: BinaryIO, path: Path, offset: int, stop: int | None, block_bytes: int) -> Iterator[Block]:
    """Read ``handle`` from ``offset`` up to ``stop`` (a line start; ``None``: EOF) in whole-line blocks."""
    carry = b""
    while stop is None or offset + len(carry) < stop:
        want = block_bytes if stop is None else min(block_bytes, stop - offset - len(carry))
        data = handle.read(want)
        if not data:
            break
        data = carry + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # no newline yet: a line longer than a block
            carry = data
            continue
        yield Block(path, offset, data[:cut])
        offset += cut
        carry = data[cut:]
    if carry:
        yield Block(path, offset, carry + b"\n")


def count_lines_before(path: Path, offset: int) -> int:
    """Number of lines before byte ``offset`` (only used to name the line of an error)."""
    opener = gzip.open if is_gzip(path) else open
    count, remaining = 0, offset
    with opener(path, "rb") as handle:
        while remaining > 0:
            data = handle.read(min(remaining, DEFAULT_BLOCK_BYTES))
            if not data:
                break
            count += data.count(b"\n")
            remaining -= len(data)
    return count


def distributed_rank() -> tuple[int, int] | None:
    """(rank, world size) of this process's default process group, None outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def reader_index(launching_rank: tuple[int, int] | None = None) -> tuple[int, int]:
    """(this reader's index, number of readers) over DDP ranks × DataLoader workers.

    A DataLoader worker started by spawn or forkserver (the default under
    ``torch.multiprocessing.spawn`` and Lightning's ``ddp_spawn``) has no process group, so the
    rank is the one its parent had when it handed the dataset over (``launching_rank``).
    """
    rank, world = distributed_rank() or launching_rank or (0, 1)
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * workers + worker, world * workers
