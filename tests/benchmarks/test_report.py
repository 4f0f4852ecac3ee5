"""benchmarks/report: the docs' results pages are what the JSON says, and the README's figures are on them."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from benchmarks.report import __main__ as report
from benchmarks.report.pages import PAGES
from benchmarks.report.provenance import date_of, device_of, host_of

ROOT = Path(__file__).resolve().parents[2]
CITING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\((?:\.\./)?(?:docs/)?results/(\w+)\.md(?:#[\w-]+)?\)")
# A measured figure: a decimal or a number with thousands commas; not a percentage or a signed difference (derived).
FIGURE = re.compile(r"(?<![\w.,+\-−±])(?:\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+)(?!\d|,\d|\.\d|\s?%)")


def test_regenerating_changes_nothing(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().err


def test_check_names_a_stale_page(tmp_path, capsys):
    report.main(["--out", str(tmp_path)])
    (tmp_path / "memory.md").write_text("edited by hand\n")
    assert report.main(["--check", "--out", str(tmp_path)]) == 1
    assert "memory.md" in capsys.readouterr().err


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_table_names_its_host_device_and_date(page):
    for section in page.sections:
        for source in section.sources:
            result = json.loads((report.RESULTS / source).read_text())
            assert date_of(result) != "not recorded", f"{source}: add a 'date' to the JSON"
            assert host_of(result) and device_of(result)


@functools.lru_cache(maxsize=1)
def _pages() -> dict[str, str]:
    return report.pages()


def _cited_blocks(text: str):
    """(pages, block) for each paragraph, or table row, that links results pages; a table's unlinked rows are cited
    by the links of its header row."""
    for block in re.split(r"\n\s*\n", text):
        rows = block.strip().splitlines()
        parts = rows if rows and all(row.startswith("|") for row in rows) else [block]
        header = set(LINK.findall(parts[0]))
        for part in parts:
            pages = set(LINK.findall(part)) or (header if len(parts) > 1 else set())
            if pages:
                yield pages, LINK.sub("", part)


@pytest.mark.parametrize("path", CITING, ids=lambda path: path.name)
def test_a_figure_beside_a_results_link_is_on_that_page(path):
    generated = _pages()
    missing = []
    for pages, block in _cited_blocks(path.read_text()):
        assert all(f"{page}.md" in generated for page in pages), f"{path.name} links a page not generated: {pages}"
        missing += [(sorted(pages), figure) for figure in FIGURE.findall(block)
                    if not any(figure in generated[f"{page}.md"] for page in pages)]
    assert not missing, f"{path.name}: figures not on the results page they link: {missing}"


def test_a_figure_check_catches_a_drifted_figure():
    text = "| table parameters | 540,201,999 ([memory](docs/results/memory.md)) |"
    blocks = list(_cited_blocks(text))
    assert blocks[0][0] == {"memory"} and "540,201,999" in FIGURE.findall(blocks[0][1])
    assert "540,201,999" not in _pages()["memory.md"]


def test_a_classifier_variant_run_on_more_seeds_is_one_row_with_its_own_dense_models():
    from benchmarks.report.tables import pairs_by_seed

    def result(seed: int, command: str, acc: float) -> dict:
        run = {"test_acc": acc, "val_loss": 0.4}
        return {"command": command, "args": {"seed": seed}, "dense_steps": 8, "extra_steps": 2,
                "dense": {"test_acc": 0.8 + seed / 100, "val_loss": 0.4}, "by_compression": {"8": {"comera": run}}}

    full = "python -m benchmarks.quality.compress_pairs"
    variant = f"{full} --systems comera"
    results = {"p.json": result(0, full, 0.80), "p_seed1.json": result(1, full, 0.81),
               **{f"v{'' if s == 0 else f'_seed{s}'}.json": result(s, variant, 0.70 + s / 100) for s in range(4)}}
    lines = pairs_by_seed(results).splitlines()
    assert "| `v` | comera | 4 | 0.715, 0.400 |" in lines
    assert "| `v` | dense (trained) | 4 | 0.815, 0.400 |" in lines, "the variant's four dense models, not the two full runs'"
    assert not any(line.startswith("| `p` | dense (trained)") for line in lines)


def test_a_variant_run_at_fewer_sizes_shows_a_dash_for_the_others():
    from benchmarks.report.tables import pairs_by_seed

    run = {"test_acc": 0.5, "val_loss": 0.4}
    full = {"command": "python -m benchmarks.quality.compress_pairs", "args": {"seed": 0}, "dense_steps": 8, "extra_steps": 2,
            "dense": {"test_acc": 0.6, "val_loss": 0.3}, "by_compression": {"4": {"comera": run}, "8": {"comera": run}}}
    variant = {**full, "command": f"{full['command']} --compressions 8 --systems comera", "by_compression": {"8": {"comera": run}}}
    lines = pairs_by_seed({"p.json": full, "v.json": variant}).splitlines()
    assert "| `v` | comera | 1 | – | 0.500, 0.400 |" in lines


def test_a_system_one_seed_ran_besides_the_others_is_its_own_row_with_its_own_count():
    from benchmarks.report.tables import pairs_by_seed

    def result(seed: int, systems: dict) -> dict:
        return {"command": "python -m benchmarks.quality.compress_pairs --systems comera", "args": {"seed": seed},
                "dense_steps": 8, "extra_steps": 2, "dense": {"test_acc": 0.6, "val_loss": 0.3}, "by_compression": {"4": systems}}

    comera, small = {"test_acc": 0.5, "val_loss": 0.4}, {"test_acc": 0.3, "val_loss": 0.7}
    lines = pairs_by_seed({"v.json": result(0, {"comera": comera}),
                           "v_seed1.json": result(1, {"comera": comera, "small": small})}).splitlines()
    assert "| `v` | comera | 2 | 0.500, 0.400 |" in lines
    assert "| `v` | small | 1 | 0.300, 0.700 |" in lines, "seed 1's small row, not dropped for seed 0's want of one"


def test_the_frontier_shows_the_latest_rerun_in_place_of_a_stale_row_in_any_file_and_means_over_seeds():
    from benchmarks.report.tables_frontier import lm_frontier

    def run(system: str, compression: float, loss: float, lr: float = 3e-3) -> dict:
        return {"system": system, "compression": compression, "val_loss": loss, "ft_lr": lr}

    def result(seed: int, extra: float, runs: list[dict]) -> dict:
        return {"args": {"seed": seed, "extra": extra}, "dense": {"final_val_loss": 3.0 + seed / 10}, "runs": runs}

    results = {
        "m.json": result(0, 0.25, [run("comera", 2, 9.0), run("comera_dense_start", 2, 3.2), run("svd_ft", 2, 9.0),
                                   run("svd_ft_dense_start_ranks", 2, 3.1), run("comera", 2, 1.0, lr=1e-3),
                                   run("small", 2, 3.5, lr=3e-4), run("comera_teacher", 2, 1.0)]),
        "m_seed1.json": result(1, 0.25, [run("comera", 2, 3.4), run("svd_ft", 2, 3.6)]),
        "m_8x.json": result(0, 0.25, [run("comera", 8, 4.0), run("svd_ft", 8, 4.5)]),
        "m_extra10.json": result(0, 0.1, [run("comera", 2, 3.9)]),
        "m_token_steps_extra10_seed1.json": result(1, 0.1, [run("comera_token_steps_4", 2, 3.5),
                                                             run("svd_ft_token_steps_4_ranks", 2, 3.6)]),
        "m_token_steps_8x.json": result(0, 0.25, [run("comera_token_steps_4", 8, 3.8)]),
    }
    lines = lm_frontier(results).splitlines()
    assert lines[0].startswith("Dense, trained: validation loss 3.050 (the mean over seeds 0, 1")
    assert "| 25 % | CoMERA (the defaults) | **3.300** | **3.800** (1) |" in lines, "the reruns, seed 1's row; not 1e-3's"
    assert "| 25 % | SVD + fine-tuning at CoMERA's ranks | 3.350 | 4.500 (1) |" in lines
    assert "| 25 % | dense of CoMERA's size from scratch, all the steps | 3.500 (1) | – |" in lines, "small at its own LR"
    assert "| 10 % | CoMERA (the defaults) | 3.700 | – |" in lines, "seed 1's rerun in another file beside seed 0's row"
    assert "| 10 % | SVD + fine-tuning at CoMERA's ranks | **3.600** (1) | – |" in lines
    assert not any("teacher" in line for line in lines)
