"""Rows/s of our Criteo reader beside TorchRec's own Criteo pipeline, on the same synthetic TSV day file.

Writes one seeded Criteo-format TSV (``--rows`` lines: 0/1 labels, 13 integer columns with empty
and negative values, 26 eight-digit hex ids with empty ones) and reads it, the systems in turn
and the order rotated every round:

* ``comera``: `CriteoIterableDataset` → ``ClickBatch`` (dense log1p, ids modulo the table sizes,
  KJT) in one process, the vectorised block parser;
* ``comera_per_line``: the same reader with the vectorised parser switched off (every block
  parsed line by line, the way the reader worked before);
* ``comera_2_workers``: the reader under a DataLoader with 2 workers, each parsing its byte range;
* ``comera_convert``: `convert_criteo_day`, our one-off conversion of the day to ``.npy`` arrays;
* ``comera_npy_batches``: `CriteoNpyDataset` → ``ClickBatch`` from those arrays (memory-mapped);
* ``torchrec_tsv_stream``: `torchrec.datasets.criteo.CriteoIterDataPipe`, TorchRec's streaming
  TSV reader (rows of Python values, no tensors);
* ``torchrec_tsv_to_npys``: `BinaryCriteoUtils.tsv_to_npys`, TorchRec's conversion of a day file
  to ``.npy`` (done once per file before training);
* ``torchrec_npy_batches``: `InMemoryBinaryCriteoIterDataPipe` → TorchRec ``Batch`` from those
  ``.npy`` files (what TorchRec's DLRM example trains from; loading included).

    .venv/bin/python -m benchmarks.scaling.criteo_reader [--rows 200000] [--rounds 3] [--batch 2048]
        [--systems comera comera_2_workers ...] [--out benchmarks/results/criteo_reader.json]

About 2 minutes at the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.probes import command_line, machine_basics

TABLE_SIZES = [100_000] * 26


def write_synthetic_day(path: Path, rows: int, seed: int = 0) -> None:
    """A Criteo-format TSV: ~25% empty integers (a few negative), ~8% empty ids, heavy-tailed values."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.25).astype(int)
    ints = np.floor(rng.pareto(1.2, (rows, 13)) * 4).astype(np.int64) - (rng.random((rows, 13)) < 0.02)
    int_empty = rng.random((rows, 13)) < 0.25
    ids = rng.integers(0, 2**32, (rows, 26), dtype=np.uint64)
    id_empty = rng.random((rows, 26)) < 0.08
    with open(path, "w") as handle:
        for r in range(rows):
            dense = ["" if int_empty[r, c] else str(ints[r, c]) for c in range(13)]
            cats = ["" if id_empty[r, c] else f"{ids[r, c]:08x}" for c in range(26)]
            handle.write("\t".join([str(labels[r]), *dense, *cats]) + "\n")


def comera_rows(path: Path, batch: int, workers: int = 0, vectorised: bool = True) -> int:
    from torch.utils.data import DataLoader

    from comera_lightning.data.criteo import tsv as criteo_tsv

    original = criteo_tsv.parse_block
    if not vectorised:
        criteo_tsv.parse_block = lambda data, sizes: None  # every block takes the per-line path
    try:
        dataset = criteo_tsv.CriteoIterableDataset([path], batch, TABLE_SIZES)
        return sum(b.labels.numel() for b in DataLoader(dataset, batch_size=None, num_workers=workers))
    finally:
        criteo_tsv.parse_block = original


def comera_convert(path: Path, folder: Path) -> int:
    from comera_lightning.data.criteo.npy import convert_criteo_day

    converted = convert_criteo_day(path, folder / "comera", TABLE_SIZES)
    return json.loads((converted / "meta.json").read_text())["rows"]


def comera_npy_batches(folder: Path, batch: int) -> int:
    from comera_lightning.data.criteo.npy import CriteoNpyDataset

    return sum(b.labels.numel() for b in CriteoNpyDataset([folder / "comera" / "day_0"], batch, TABLE_SIZES))


def torchrec_stream_rows(path: Path) -> int:
    from torchrec.datasets.criteo import CriteoIterDataPipe

    return sum(1 for _ in CriteoIterDataPipe([str(path)]))


def torchrec_to_npys(path: Path, folder: Path) -> int:
    from torchrec.datasets.criteo import BinaryCriteoUtils

    names = [str(folder / f"day_0_{kind}.npy") for kind in ("dense", "sparse", "labels")]
    BinaryCriteoUtils.tsv_to_npys(str(path), *names)
    return int(np.load(names[2], mmap_mode="r").shape[0])


def torchrec_npy_batches(folder: Path, batch: int) -> int:
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    names = [[str(folder / f"day_0_{kind}.npy")] for kind in ("dense", "sparse", "labels")]
    pipe = InMemoryBinaryCriteoIterDataPipe("train", *names, batch_size=batch, rank=0, world_size=1, hashes=TABLE_SIZES)
    return sum(int(b.labels.numel()) for b in pipe)


def measure(systems: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Rows/s of each system, once per round, the order rotated every round (after one untimed run each)."""
    names = list(systems)
    for name in names:  # imports, first-call set-up, the file in the page cache
        systems[name]()
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            start = time.perf_counter()
            rows = systems[name]()
            rates[name].append(rows / (time.perf_counter() - start))
            print(f"round {round_index}: {name:22s} {rates[name][-1]:12,.0f} rows/s", flush=True)
    return rates


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--systems", nargs="+", default=None, help="a subset of the systems (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        day = folder / "day_0"
        write_synthetic_day(day, args.rows)
        torchrec_to_npys(day, folder)  # the .npy files the *_npy_batches systems read exist from round 0
        comera_convert(day, folder)
        systems = {
            "comera": lambda: comera_rows(day, args.batch),
            "comera_per_line": lambda: comera_rows(day, args.batch, vectorised=False),
            "comera_2_workers": lambda: comera_rows(day, args.batch, workers=2),
            "comera_convert": lambda: comera_convert(day, folder),
            "comera_npy_batches": lambda: comera_npy_batches(folder, args.batch),
            "torchrec_tsv_stream": lambda: torchrec_stream_rows(day),
            "torchrec_tsv_to_npys": lambda: torchrec_to_npys(day, folder),
            "torchrec_npy_batches": lambda: torchrec_npy_batches(folder, args.batch),
        }
        unknown = sorted(set(args.systems or []) - set(systems))
        if unknown:
            parser.error(f"unknown systems {unknown}; choose from {list(systems)}")
        systems = {name: run for name, run in systems.items() if args.systems is None or name in args.systems}
        file_mb = day.stat().st_size / 2**20
        rates = measure(systems, args.rounds)
    result = summarise(rates, args, file_mb)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarise(rates: dict[str, list[float]], args: argparse.Namespace, file_mb: float) -> dict:
    """Median and range of rows/s per system, and the ratios of ``comera`` to each of the others."""
    medians = {name: statistics.median(values) for name, values in rates.items()}
    systems = {
        name: {"rows_per_s_median": round(medians[name]), "rows_per_s_range": [round(min(v)), round(max(v))]}
        for name, v in rates.items()
    }
    ratios = {f"comera_over_{name}": round(medians["comera"] / medians[name], 2) for name in rates if name != "comera"
              if "comera" in medians}
    print("\n".join(f"{name:22s} {s['rows_per_s_median']:12,d} rows/s  (range {s['rows_per_s_range']})" for name, s in systems.items()))
    print(json.dumps(ratios, indent=2))
    return {
        "command": command_line(),
        "machine": machine_basics(),
        "rows": args.rows,
        "file_mb": round(file_mb, 1),
        "batch": args.batch,
        "rounds": args.rounds,
        "systems": systems,
        "ratios": ratios,
    }


if __name__ == "__main__":
    main()
