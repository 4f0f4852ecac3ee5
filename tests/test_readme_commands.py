"""Every shell command of README.md, run on a fresh clone of HEAD (``make test-readme``; slow, ~5-10 min on 2 cores).

Commands are taken from the README's ```bash blocks as written. Training commands get a short-run
suffix (one epoch, a few batches: ``SHORT``) so the whole README runs in minutes; commands that
need what a fresh clone cannot have (a GPU, the MNLI files, a pretrained model folder, the package
index for a second install) are listed in ``NOT_RUN`` with the reason. Longer commands live in docs/
(docs/USAGE.md, docs/TUNING.md, ...) and are not run here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHORT = {
    "comera-lightning": ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
                         "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false"],
    "examples/huggingface.py": ["--epochs", "2", "--train-samples", "2000"],
}
SHORT["comera_lightning.cli.demo"] = SHORT["comera-lightning"]
NOT_RUN = {
    "/path/to/MNLI": "needs the MNLI files",
    "--pretrained DIR": "needs a pretrained model folder",
    "make ": "make targets are checked by CI itself (make test, make demo)",
    "pip ": "installing from a wheel: tests/test_wheel_install.py",
    "comera-lightning fit --config transformer_tiny --threads 1": "run from the installed wheel in tests/test_wheel_install.py",
    "python -m comera_lightning.cli.demo\n": "run in full by make demo",
    "--ckpt_path logs/transformer/": "needs a trained paper-Transformer checkpoint (hours); the README exports and "
                                     "predicts with transformer_tiny's the same way",
    "configs/transformer.yaml --program": "serves the paper-Transformer program the export above writes; the README "
                                          "predicts with transformer_tiny's",
    "day_0.gz": "needs Criteo day files; tests/data/criteo/test_npy.py converts a synthetic day",
}


def readme_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks (continuation lines joined, comments dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _not_run(command: str) -> str | None:
    return next((why for key, why in NOT_RUN.items() if key in command + "\n"), None)


def test_readme_and_results_hold_no_absolute_checkout_paths() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(readme_commands(text)) >= 10
    assert "/work/" not in text and "shared docs" not in text
    for result in (ROOT / "benchmarks" / "results").glob("*.json"):
        recorded = result.read_text()
        assert str(ROOT) not in recorded and "/work/main" not in recorded, result.name


#: Guides whose commands and first python example run like the README's (each on a clone of its own); a guide's
#: command the README has too runs once, with the README's.
GUIDES = ("README.md", "docs/index.md", "docs/COMPRESS.md", "docs/SCALING.md", "docs/USAGE.md", "docs/INFERENCE_EXPORT.md")
#: The commands each guide must have run (a guide whose commands are all the README's or all need what a clone lacks:
#: none of its own).
MIN_RUN = {"README.md": 5, "docs/COMPRESS.md": 2, "docs/SCALING.md": 2}
#: Pages whose commands are records of what ran (history, measurement sessions), not instructions: not run here.
RECORDS = ("docs/CHANGELOG", "docs/TUNING", "docs/INFERENCE_MEASURED.md", "docs/INFERENCE_EMBEDDINGS.md", "docs/results/")


def _guide_commands() -> list[str]:
    return [c for page in GUIDES for c in readme_commands((ROOT / page).read_text())]


def test_not_run_and_short_match_readme_commands() -> None:
    """Every ``NOT_RUN`` and ``SHORT`` key still names a guide's command: a stale key would hide nothing or shorten nothing."""
    commands = _guide_commands()
    assert [key for key in NOT_RUN if not any(key in command + "\n" for command in commands)] == []
    assert [key for key in SHORT if not any(key in command for command in commands)] == []


def test_every_command_in_the_docs_is_a_guides_or_a_records():
    """A ```bash command on any page of docs/ is run by a test here (a guide's) or is on a page of records."""
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not str(p.relative_to(ROOT)).startswith(RECORDS)]
    unrun = {str(p.relative_to(ROOT)) for p in pages if readme_commands(p.read_text())} - set(GUIDES)
    assert not unrun, f"pages with commands no test runs: {sorted(unrun)}: add them to GUIDES or RECORDS"


@pytest.mark.slow
@pytest.mark.parametrize("page", GUIDES)
def test_every_readme_command_runs_on_a_fresh_clone(tmp_path: Path, page: str) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(Path(sys.executable).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="offline", PYTHONPATH=str(clone), COMERA_CACHE_DIR=str(tmp_path / "cache"))
    failures, ran = [], 0
    in_readme = set(readme_commands((ROOT / "README.md").read_text())) if page != "README.md" else set()
    for command in readme_commands((ROOT / page).read_text()):
        if _not_run(command) or command in in_readme:
            continue
        argv = shlex.split(command.replace(".venv/bin/", f"{sys.prefix}/bin/"))
        assignments = dict(a.split("=", 1) for a in argv if re.fullmatch(r"[A-Z_]+=\S*", a))
        argv = [a for a in argv if not re.fullmatch(r"[A-Z_]+=\S*", a)]
        argv += next((extra for key, extra in SHORT.items() if key in command), [])
        done = subprocess.run(argv, cwd=clone, env={**env, **assignments}, capture_output=True, text=True, timeout=900)
        ran += 1
        if done.returncode != 0:
            failures.append(f"{command}\n{done.stderr[-1500:]}")
    assert ran >= MIN_RUN.get(page, 0) and not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_readme_code_example_trains_compresses_and_prints_what_it_claims(tmp_path) -> None:
    """The README's ```python example, as a user pastes it: it trains, compresses and prints the figures quoted there."""
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    loss, before, after = re.search(r"validation loss ([\d.]+); parameters ([\d,]+) -> ([\d,]+)", done.stdout).groups()
    quoted = re.search(r"validation loss ([\d.]+); parameters ([\d,]+) -> ([\d,]+)", text.split(code, 1)[1]).groups()
    assert before == quoted[1], "the README quotes the dense size the example prints"
    assert abs(float(loss) / float(quoted[0]) - 1) < 0.05, "the README's loss is what the example gives (within 5 %: CPU hosts differ)"
    assert int(after.replace(",", "")) < int(before.replace(",", "")) / 1.5


@pytest.mark.slow
def test_the_first_page_example_trains_compresses_and_exports(tmp_path) -> None:
    """docs/index.md's ```python example, the newcomer's first run: it trains, compresses, exports and serves."""
    text = (ROOT / "docs" / "index.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = re.search(r"parameters ([\d,]+) -> ([\d,]+)", done.stdout).groups()
    assert f"({before} parameters before" in text, "the page quotes the dense size the example prints"
    assert int(after.replace(",", "")) < int(before.replace(",", "")) / 1.5
    assert "served logits (2, 64, 2048)" in done.stdout and (tmp_path / "my_model.pt2").stat().st_size > 0


@pytest.mark.slow
def test_the_compress_guide_example_prints_what_it_claims(tmp_path) -> None:
    """docs/COMPRESS.md's ```python example: it trains dense, compresses 8x and prints the figures quoted under it."""
    text = (ROOT / "docs" / "COMPRESS.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    pattern = r"test accuracy ([\d.]+) -> ([\d.]+); parameters ([\d,]+) -> ([\d,]+)"
    printed = re.search(pattern, done.stdout).groups()
    quoted = re.search(pattern, text.split(code, 1)[1]).groups()
    assert printed[2] == quoted[2], "the guide quotes the dense size the example prints"
    assert abs(float(printed[1]) - float(quoted[1])) < 0.02, "the compressed accuracy is the guide's (2 points: CPU hosts differ)"
    assert int(printed[3].replace(",", "")) < int(printed[2].replace(",", "")) / 3
