"""Read an offline W&B run (``wandb/offline-run-*/run-*.wandb``) back without a W&B server.

    python -m comera_lightning.cli.wandb_offline logs/wandb/offline-run-*        # config, summary, history keys as JSON

The ``.wandb`` file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version),
then LevelDB-log records (CRC, 2-byte length, type; 32 KiB blocks, records split FIRST/MIDDLE/LAST)
each holding a ``wandb_internal_pb2.Record`` protobuf, decoded here with W&B's own message classes.
"""

from __future__ import annotations

import argparse
import json
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["read_offline_run", "records"]

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    """The payloads of the log, joined across FIRST/MIDDLE/LAST pieces."""
    if data[:4] != b":W&B":
        raise ValueError("not a W&B transaction log (no ':W&B' header)")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER:  # the block's tail is padding
            pos += room
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        payload = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            yield pending + payload
        else:  # zero padding at the end of a file still being written
            break


def records(path: str | Path) -> Iterator[Any]:
    """Every ``Record`` of a ``.wandb`` file (or of the one in an offline run folder)."""
    from wandb.proto import wandb_internal_pb2

    path = Path(path)
    if path.is_dir():
        path = next(path.glob("*.wandb"), path / "missing.wandb")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no .wandb file; pass an offline-run-* folder or its run-*.wandb file.")
    for payload in _chunks(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _set(target: dict[str, Any], keys: Sequence[str], value_json: str) -> None:
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = json.loads(value_json)


def read_offline_run(path: str | Path) -> dict[str, Any]:
    """``{"config": {...}, "summary": {...}, "history": [{...}, ...]}`` of an offline run, as logged."""
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            for item in record.config.update:
                _set(config, list(item.nested_key) or [item.key], item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                _set(summary, list(item.nested_key) or [item.key], item.value_json)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                row["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
            history.append(row)
    config = {k: v.get("value", v) if isinstance(v, dict) and set(v) <= {"value", "desc"} else v for k, v in config.items()}
    return {"config": config, "summary": summary, "history": history}


def main(argv: Sequence[str] | None = None) -> None:
    """Print an offline run's config, summary and history keys as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an offline-run-* folder or its run-*.wandb file")
    run = read_offline_run(parser.parse_args(argv).run)
    keys = sorted({k for row in run["history"] for k in row})
    print(json.dumps({"config": run["config"], "summary": run["summary"], "history_keys": keys}, indent=2, default=str))


if __name__ == "__main__":
    main()
