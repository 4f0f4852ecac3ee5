"""The documentation site (mkdocs.yml): the strict build passes and the API pages carry the docstrings."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                reason="mkdocs is not installed (the dev extra: make setup)")

#: Each name and the API page that documents it.
DOCUMENTED = {"ComeraCallback": "callback", "BudgetConfig": "callback", "CUDAGraphStrategy": "callback",
              "TensorizeConfig": "tensorize", "tensorize": "tensorize", "TTLinear": "layers", "TTEmbedding": "layers",
              "export": "export"}


def _squeezed(text: str) -> str:
    """``text`` without whitespace: markup splits words from the punctuation beside them (``<code>x</code>'s``)."""
    return re.sub(r"\s+", "", text)


def _text(page: Path) -> str:
    """The page's visible text, tags and whitespace dropped."""
    return _squeezed(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))))


def _first_line(name: str) -> str:
    import comera_lightning

    return _squeezed(getattr(comera_lightning, name).__doc__.strip().splitlines()[0].replace("``", ""))


def _appended_entry(name: str) -> str:
    """``name``'s description among the Args: entries ``ComeraCallback`` gains at import (one line each)."""
    from comera_lightning import ComeraCallback

    entry = next(line for line in ComeraCallback.__doc__.splitlines() if line.strip().startswith(f"{name}:"))
    return entry.split(":", 1)[1]


def test_the_strict_build_renders_the_docstrings(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, page in DOCUMENTED.items():
        text = _text(tmp_path / "api" / page / "index.html")
        assert _first_line(name) in text, f"{name}'s docstring is not on api/{page}/"
    callback = _text(tmp_path / "api" / "callback" / "index.html")
    signature = _squeezed("ComeraCallback(max_rank: int | list[int] | None = None,")
    assert signature in callback, "the signature with its defaults"
    assert _squeezed(_appended_entry("size_surrogate")) in callback, "an Args: entry added at import"
    assert (tmp_path / "repo" / "benchmarks" / "results" / "demo_compression.png").is_file(), "USAGE.md's figure"
