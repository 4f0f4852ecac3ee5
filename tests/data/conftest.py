"""The data tests keep their tokenizer caches in a temporary folder."""

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path / "cache"))
