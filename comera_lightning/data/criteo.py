"""Criteo Display Advertising click logs: streamed TSV files, and synthetic Criteo-shaped batches.

Each line of a Criteo file is ``label \\t I1..I13 \\t C1..C26``: a 0/1 label, 13 integer
counts (possibly empty, possibly negative) and 26 categorical values hashed to 8 hex digits
(possibly empty). Dense values become ``log(1 + max(x, 0))`` (empty → 0); a categorical value
becomes ``int(hex, 16) % table_size`` (empty → 0). The files are read line by line, so a
multi-GB day never has to fit in memory.
"""

from __future__ import annotations

import gzip
import logging
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from comera_lightning.data.click_logs import (
    ClickBatch,
    ClickLogDataModule,
    DatasetNotFoundError,
    kjt_from_id_matrix,
)

__all__ = [
    "CRITEO_KAGGLE_TABLE_SIZES",
    "CRITEO_CAT_NAMES",
    "CriteoDataModule",
    "CriteoIterableDataset",
    "SyntheticCriteoDataModule",
    "SyntheticCriteoDataset",
    "parse_criteo_line",
]

log = logging.getLogger(__name__)

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

_MASK64 = (1 << 64) - 1
_DENSE_RE = re.compile(r"(?:-?[0-9]+)?")
_HEX_RE = re.compile(r"[0-9a-fA-F]*")
_LINE_RE = re.compile(
    "([01])" + f"\t({_DENSE_RE.pattern})" * NUM_DENSE + f"\t({_HEX_RE.pattern})" * NUM_SPARSE
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
    match = _LINE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"{path}, line {line_no}: {_line_problem(text)}")
    groups = match.groups()
    dense = [int(v) if v else 0 for v in groups[1 : 1 + NUM_DENSE]]
    sparse = [int(v, 16) if v else -1 for v in groups[1 + NUM_DENSE :]]
    return int(groups[0]), dense, sparse


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
    raw = torch.tensor(sparse, dtype=torch.int64).view(batch, NUM_SPARSE)
    ids = torch.where(raw < 0, torch.zeros_like(raw), raw.remainder(sizes))
    return ClickBatch(
        dense=dense_t.clamp_min_(0).log1p_().to(torch.float32),
        sparse=kjt_from_id_matrix(CRITEO_CAT_NAMES, ids),
        labels=torch.tensor(labels, dtype=torch.float32),
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
            with _open_text(path) as handle:
                for line_no, line in enumerate(handle, start=1):
                    owned = global_line % readers == reader
                    global_line += 1
                    if owned:
                        yield parse_criteo_line(line, str(path), line_no)

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


def _as_file_list(files: str | Sequence[str] | None) -> list[str]:
    """Normalise a path or a list of paths to a list."""
    if files is None:
        return []
    if isinstance(files, (str, Path)):
        return [str(files)]
    return [str(f) for f in files]


class CriteoDataModule(ClickLogDataModule):
    """Criteo Display Advertising TSV files from disk (plain or ``.gz``), streamed.

    ``train_files``, ``val_files`` and ``test_files`` are paths (a path or a list each; a
    list is read in order, e.g. days 0..22). ``table_sizes`` defaults to the Kaggle
    cardinalities. Batches are built by the reading workers; lines are not shuffled (as in
    the DLRM reference, which reads the days in order).
    """

    def __init__(
        self,
        train_files: list[str] | str | None = None,
        val_files: list[str] | str | None = None,
        test_files: list[str] | str | None = None,
        batch_size: int = 2048,
        eval_batch_size: int | None = None,
        table_sizes: list[int] | None = None,
        num_workers: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if batch_size <= 0 or (eval_batch_size is not None and eval_batch_size <= 0):
            raise ValueError(
                f"batch sizes must be positive, got batch_size={batch_size}, eval_batch_size={eval_batch_size}."
            )
        self.save_hyperparameters()
        self.files = {
            "train": _as_file_list(train_files),
            "val": _as_file_list(val_files),
            "test": _as_file_list(test_files),
        }
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self._table_sizes = _check_table_sizes(table_sizes)
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.pin_memory = pin_memory

    @property
    def feature_names(self) -> list[str]:
        """``cat_0`` … ``cat_25`` (TorchRec's DEFAULT_CAT_NAMES)."""
        return list(CRITEO_CAT_NAMES)

    @property
    def table_sizes(self) -> list[int]:
        """Rows per categorical table (ids are hashes modulo these)."""
        return list(self._table_sizes)

    @property
    def num_dense(self) -> int:
        """13 integer features."""
        return NUM_DENSE

    def prepare_data(self) -> None:
        """Check that every configured file exists."""
        for split, files in self.files.items():
            for path in files:
                if not Path(path).is_file():
                    raise DatasetNotFoundError(f"{split} file {path!r} does not exist; fix {split}_files.")

    def setup(self, stage: str | None = None) -> None:
        """Validate the paths (nothing is loaded: the files are streamed)."""
        self.prepare_data()
        log.info("Criteo files: %s", {split: files for split, files in self.files.items() if files})

    def train_dataloader(self) -> DataLoader:
        """Batches streamed from ``train_files``."""
        return self._loader("train", self.batch_size, self.drop_last)

    def val_dataloader(self) -> DataLoader:
        """Batches streamed from ``val_files``."""
        return self._loader("val", self.eval_batch_size, False)

    def test_dataloader(self) -> DataLoader:
        """Batches streamed from ``test_files``."""
        return self._loader("test", self.eval_batch_size, False)

    def _loader(self, split: str, batch_size: int, drop_last: bool) -> DataLoader:
        files = self.files[split]
        if not files:
            raise ValueError(f"no {split} files configured; pass {split}_files= one or more Criteo TSV paths.")
        dataset = CriteoIterableDataset(files, batch_size, self._table_sizes, drop_last=drop_last)
        return DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
        )


def power_law_ids(num_samples: int, size: int, exponent: float, generator: torch.Generator) -> Tensor:
    """Draw ``num_samples`` ranks in ``[0, size)`` with P(rank r) ∝ (r + 1)^-exponent, approximately.

    Inverse-CDF sampling of a power law on ``[1, size + 1)``, floored; exact Zipf needs a
    normaliser over ``size`` terms, which is too slow for tens of millions of rows.
    """
    u = torch.rand(num_samples, generator=generator, dtype=torch.float64)
    if abs(exponent - 1.0) < 1e-9:
        x = torch.exp(u * math.log(size + 1))
    else:
        one_minus = 1.0 - exponent
        top = (size + 1) ** one_minus
        x = (1.0 + u * (top - 1.0)) ** (1.0 / one_minus)
    return (x.floor().to(torch.int64) - 1).clamp_(0, size - 1)


def _mix_seed(*parts: int) -> int:
    """Hash integers into one 32-bit seed (torch's CPU generator only uses the low 32 bits)."""
    state = 0
    for part in parts:
        state = (state ^ (part & _MASK64)) * 0x9E3779B97F4A7C15 & _MASK64  # splitmix64 step
        state ^= state >> 30
        state = state * 0xBF58476D1CE4E5B9 & _MASK64
        state ^= state >> 27
        state = state * 0x94D049BB133111EB & _MASK64
        state ^= state >> 31
    return (state ^ (state >> 32)) & 0xFFFFFFFF


def _scatter_multiplier(size: int) -> int:
    """A multiplier coprime to ``size``, so ``rank * m % size`` is a bijection on ``[0, size)``.

    Returns 1 (no scattering) for tables of 2**31 rows or more, where the int64 product could overflow.
    """
    if size >= 2**31:
        return 1
    multiplier = 2654435761 % size or 1  # Knuth's multiplicative-hash constant
    while math.gcd(multiplier, size) != 1:
        multiplier += 1
    return multiplier


class SyntheticCriteoDataset(Dataset):
    """Deterministic synthetic Criteo-shaped batches: item ``i`` is batch ``i``, seeded by (seed, stream, i).

    Ids follow a power law per table (hot ids repeat within a batch, as in real click logs),
    scattered over the table by a fixed bijection; dense features are log1p of exponential
    counts; labels are Bernoulli with a logit linear in the dense features (weights fixed by
    ``seed`` alone, so every ``stream``, i.e. split, shares them; about 25 % positives, as in Criteo).
    """

    def __init__(
        self,
        num_batches: int,
        batch_size: int,
        table_sizes: Sequence[int],
        num_dense: int = NUM_DENSE,
        zipf_exponent: float = 1.05,
        seed: int = 0,
        stream: int = 0,
        scatter_ids: bool = True,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.num_batches = num_batches
        self.batch_size = batch_size
        self.table_sizes = [int(s) for s in table_sizes]
        self.num_dense = num_dense
        self.zipf_exponent = zipf_exponent
        self.seed = seed
        self.multipliers = [_scatter_multiplier(s) if scatter_ids else 1 for s in self.table_sizes]
        self.feature_names = [f"cat_{i}" for i in range(len(self.table_sizes))]
        weights = torch.Generator().manual_seed(seed)
        self._label_weights = torch.randn(num_dense, generator=weights) / math.sqrt(num_dense)

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> ClickBatch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} out of range [0, {self.num_batches}).")
        generator = torch.Generator().manual_seed(_mix_seed(self.seed, self.stream, index))
        batch = self.batch_size
        ids = torch.empty(batch, len(self.table_sizes), dtype=torch.int64)
        for column, (size, multiplier) in enumerate(zip(self.table_sizes, self.multipliers)):
            ranks = power_law_ids(batch, size, self.zipf_exponent, generator)
            ids[:, column] = ranks * multiplier % size if multiplier != 1 else ranks
        counts = torch.empty(batch, self.num_dense).exponential_(0.1, generator=generator)
        dense = counts.floor().log1p()
        logits = (dense - 2.0) @ self._label_weights - 1.35
        labels = torch.bernoulli(torch.sigmoid(logits), generator=generator)
        return ClickBatch(dense=dense, sparse=kjt_from_id_matrix(self.feature_names, ids), labels=labels)


class SyntheticCriteoDataModule(ClickLogDataModule):
    """Synthetic Criteo-shaped data at full table cardinalities, for memory and speed benchmarks.

    Seeded and deterministic (batch ``i`` of a split is the same on every run and in every
    worker); ``num_batches`` training batches, ``val_batches``/``test_batches`` for evaluation.
    """

    def __init__(
        self,
        batch_size: int = 2048,
        num_batches: int = 100,
        val_batches: int = 10,
        test_batches: int = 10,
        table_sizes: list[int] | None = None,
        num_dense: int = NUM_DENSE,
        zipf_exponent: float = 1.05,
        seed: int = 0,
        scatter_ids: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        if batch_size <= 0 or num_batches <= 0 or val_batches < 0 or test_batches < 0:
            raise ValueError(
                "batch_size and num_batches must be positive and val/test_batches non-negative, got "
                f"batch_size={batch_size}, num_batches={num_batches}, "
                f"val_batches={val_batches}, test_batches={test_batches}."
            )
        if zipf_exponent <= 0:
            raise ValueError(f"zipf_exponent must be positive (about 1 for click logs), got {zipf_exponent}.")
        if num_dense < 1:
            raise ValueError(f"num_dense must be at least 1, got {num_dense}.")
        if table_sizes is not None and (not table_sizes or any(int(s) < 1 for s in table_sizes)):
            raise ValueError(f"table_sizes must be a non-empty list of positive integers, got {table_sizes}.")
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.num_batches = {"train": num_batches, "val": val_batches, "test": test_batches}
        self._table_sizes = list(CRITEO_KAGGLE_TABLE_SIZES if table_sizes is None else table_sizes)
        self._num_dense = num_dense
        self.zipf_exponent = zipf_exponent
        self.seed = seed
        self.scatter_ids = scatter_ids
        self.num_workers = num_workers
        self.pin_memory = pin_memory

    @property
    def feature_names(self) -> list[str]:
        """``cat_0`` … ``cat_{T-1}``, one per table."""
        return [f"cat_{i}" for i in range(len(self._table_sizes))]

    @property
    def table_sizes(self) -> list[int]:
        """Rows per table (Criteo Kaggle cardinalities by default)."""
        return list(self._table_sizes)

    @property
    def num_dense(self) -> int:
        """Number of dense features (13 by default)."""
        return self._num_dense

    def dataset(self, split: str) -> SyntheticCriteoDataset:
        """The deterministic batch dataset of ``split`` (each split has its own seed stream)."""
        if split not in self.num_batches:
            raise ValueError(f"unknown split {split!r}; choose one of {list(self.num_batches)}.")
        offset = {"train": 0, "val": 1, "test": 2}[split]
        return SyntheticCriteoDataset(
            num_batches=self.num_batches[split],
            batch_size=self.batch_size,
            table_sizes=self._table_sizes,
            num_dense=self._num_dense,
            zipf_exponent=self.zipf_exponent,
            seed=self.seed,
            stream=offset,
            scatter_ids=self.scatter_ids,
        )

    def train_dataloader(self) -> DataLoader:
        """``num_batches`` synthetic training batches."""
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        """``val_batches`` synthetic validation batches."""
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        """``test_batches`` synthetic test batches."""
        return self._loader("test")

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(
            self.dataset(split),
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
        )
