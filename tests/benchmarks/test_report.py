"""benchmarks/report: the docs' results pages are what the JSON says, and the README's figures are on them."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from benchmarks.report import __main__ as report
from benchmarks.report.pages import PAGES
from benchmarks.report.provenance import date_of, device_of, host_of

ROOT = Path(__file__).resolve().parents[2]
CITING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\((?:\.\./)?(?:docs/)?results/(\w+)\.md(?:#[\w-]+)?\)")
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+")


def test_regenerating_changes_nothing(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().err


def test_check_names_a_stale_page(tmp_path, capsys):
    report.main(["--out", str(tmp_path)])
    (tmp_path / "memory.md").write_text("edited by hand\n")
    assert report.main(["--check", "--out", str(tmp_path)]) == 1
    assert "memory.md" in capsys.readouterr().err


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_table_names_its_host_device_and_date(page):
    import json

    for section in page.sections:
        result = json.loads((report.RESULTS / section.source).read_text())
        assert date_of(result) != "not recorded", f"{section.source}: add a 'date' to the JSON"
        assert host_of(result) and device_of(result)


@functools.lru_cache(maxsize=1)
def _pages() -> dict[str, str]:
    return report.pages()


def _cited_blocks(text: str):
    """(page, block) for each table row or paragraph that links a results page."""
    for block in re.split(r"\n\s*\n|\n(?=\|)", text):
        for page in set(LINK.findall(block)):
            yield page, LINK.sub("", block)


@pytest.mark.parametrize("path", CITING, ids=lambda path: path.name)
def test_a_figure_beside_a_results_link_is_on_that_page(path):
    pages = _pages()
    missing = []
    for page, block in _cited_blocks(path.read_text()):
        assert f"{page}.md" in pages, f"{path.name} links results/{page}.md, which is not generated"
        missing += [(page, figure) for figure in FIGURE.findall(block) if figure not in pages[f"{page}.md"]]
    assert not missing, f"{path.name}: figures not on the results page they link: {missing}"


def test_a_figure_check_catches_a_drifted_figure():
    text = "| table parameters | 540,201,999 ([memory](docs/results/memory.md)) |"
    blocks = list(_cited_blocks(text))
    assert blocks and "540,201,999" in FIGURE.findall(blocks[0][1])
    assert "540,201,999" not in _pages()["memory.md"]
