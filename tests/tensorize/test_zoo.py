"""The compatibility matrix (issue #29): every model family a user may bring, through every step of a CoMERA run.

For each family of ``tests/helpers/zoo_families.py`` (torch, Lightning's demo, Hugging Face, litgpt, TorchRec):
tensorize -> the report lists what was swapped and skipped -> training steps in train mode -> eval -> a prune ->
``comera_lightning.export`` (same outputs) -> the state and the program reloaded in a new process (one process
for all families, same logits) -> a ``torch.compile``d module trains a step (the slow ones under ``-m slow``).
A family whose package is missing is skipped with the reason. ``COMERA_ZOO_TABLE=path`` writes
docs/SUPPORTED_MODELS.md from the run (``make zoo-table``).
"""

import json
import math
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.zoo_families import BY_KEY, FAMILIES
from tests.helpers.zoo_steps import compiled_step, run_family
from tests.helpers.zoo_table import Row, write_table

KEYS = [f.key for f in FAMILIES]
#: torch.compile traces a whole Hugging Face or litgpt model for tens of seconds on 2 CPU cores: those run under -m slow.
COMPILED_BY_DEFAULT = {"torchrec-dlrm-dcn"}
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "WANDB_MODE": "disabled"}
ROWS: dict[str, Row] = {}  # what this run found, for the table


def _family(key: str):
    family = BY_KEY[key]
    reason = family.missing()
    if reason is not None:
        ROWS[key] = Row(family, skipped=f"skipped: {reason}")
        pytest.skip(reason)
    return family


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def runs(folder):
    """``runs(key)``: the family's in-process steps, run once (a failure is raised again by each test that asks)."""
    done: dict[str, object] = {}

    def get(key: str):
        if key not in done:
            try:
                done[key] = run_family(BY_KEY[key], folder)
            except Exception as err:  # noqa: BLE001  (kept, so the other families still run and reload)
                done[key] = err
        if isinstance(done[key], Exception):
            raise done[key]
        return done[key]

    return get


def _reload_all(folder, runs, *options: str) -> dict:
    """Every available family saved, then reloaded in one new process: key -> differences or error."""
    for key in KEYS:
        if BY_KEY[key].missing() is None:
            try:
                runs(key)
            except Exception:  # noqa: BLE001  (that family's own test reports it)
                pass
    command = [sys.executable, "-m", "tests.scripts.zoo_reload_script", str(folder), *options]
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reloads(folder, runs):
    """The saved states, reloaded in one new process."""
    return _reload_all(folder, runs)


@pytest.fixture(scope="module")
def program_reloads(folder, runs):
    """The saved states and exported programs (``torch.export.load``: seconds each), reloaded in one new process."""
    return _reload_all(folder, runs, "--programs")


@pytest.mark.parametrize("key", KEYS)
def test_tensorize_train_eval_prune_export(key, runs):
    family = _family(key)
    run = runs(key)
    ROWS.setdefault(key, Row(family)).run = run
    report, text = run.report, str(run.report)
    assert report.swapped, text
    assert all(r.name in text for r in report.swapped) and all(name in text for name, _ in report.skipped)
    decided = [r.name for r in report.swapped] + [name for name, _ in report.skipped]
    for target in family.targets:  # each target was swapped, or the report says why not
        assert any(n == target or n.endswith("." + target) for n in decided), f"{target} neither swapped nor skipped:\n{text}"
    assert run.trained_ok(), f"losses {run.losses}, after prune {run.loss_after_prune}, grads {run.tt_grads}, removed {run.removed}"
    assert run.export_ok(), f"exported outputs differ by {run.export_error:.3g} (tolerance {run.tolerance():.3g})"


def _check_new_process(key: str, runs, results: dict, measure: str, column: str, what: str) -> None:
    """A new process's ``results[key][measure]`` within the family's tolerance; the table's ``column`` records it."""
    family = _family(key)  # skips first when the family's package is missing
    run, result = runs(key), results[key]
    setattr(ROWS.setdefault(key, Row(family)), column, "error" not in result and result[measure] <= run.tolerance())
    assert "error" not in result, result.get("error")
    assert result[measure] <= run.tolerance(), f"{what} differ by {result[measure]:.3g}"


@pytest.mark.parametrize("key", KEYS)
def test_state_reloads_in_a_new_process(key, runs, reloads):
    _check_new_process(key, runs, reloads, "state", "reload_ok", "reloaded state: logits")


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_exported_program_loads_in_a_new_process(key, runs, program_reloads):
    _check_new_process(key, runs, program_reloads, "program", "program_loaded", "loaded program: outputs")


def _compile_marks(key: str) -> list:
    marks = [] if key in COMPILED_BY_DEFAULT else [pytest.mark.slow]
    known = BY_KEY[key].known_failures.get("compile")
    return marks + ([pytest.mark.xfail(strict=True, reason=known)] if known else [])


@pytest.mark.parametrize("key", [pytest.param(k, marks=_compile_marks(k)) for k in KEYS])
def test_compiled_module_trains_a_step(key):
    family = _family(key)
    ROWS.setdefault(key, Row(family)).compiled = False
    loss, grads = compiled_step(family)
    assert math.isfinite(loss) and grads, f"compiled step: loss {loss}, every TT layer got gradients: {grads}"
    ROWS[key].compiled = True


def test_supported_models_page_has_a_row_per_family(reloads):
    """With COMERA_ZOO_TABLE=path the page is written from this run first; it must name every family."""
    target = os.environ.get("COMERA_ZOO_TABLE")
    if target:
        write_table(ROOT / target, ROWS)
    page = (ROOT / "docs" / "SUPPORTED_MODELS.md").read_text()
    missing = [f.family for f in FAMILIES if f"| {f.library} | {f.family} |" not in page]
    assert not missing, f"docs/SUPPORTED_MODELS.md has no row for {missing}: run `make zoo-table`"
