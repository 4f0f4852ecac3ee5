"""Small C4-style shards (gzip JSON lines with a ``text`` field, as ``c4-train.*.json.gz``), for the text-file tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest


def sentences(shard: int, count: int) -> list[str]:
    """``count`` short English documents; each names its shard (``shard{N}``) and its number."""
    return [f"Document {i} of shard{shard}: the quick brown fox jumps over the lazy dog {i % 7} times, "
            f"and the {['red', 'green', 'blue'][i % 3]} bird sings." for i in range(count)]


def write_shard(path: Path, texts: list[str], field: str = "text") -> Path:
    """A gzip JSON-lines file of ``texts`` (with C4's other fields) at ``path``."""
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for i, text in enumerate(texts):
            handle.write(json.dumps({field: text, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://x/{i}"}) + "\n")
    return path


@pytest.fixture
def c4_dir(tmp_path: Path) -> Path:
    """Three shards of 30 documents: ``c4-train.0000{0,1,2}-of-00003.json.gz``."""
    root = tmp_path / "c4"
    root.mkdir()
    for shard in range(3):
        write_shard(root / f"c4-train.{shard:05d}-of-00003.json.gz", sentences(shard, 30))
    return root
