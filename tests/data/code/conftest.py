"""A small tree of Python files, for the code-corpus tests."""

from pathlib import Path

import pytest

from tests.helpers.code_files import python_source


@pytest.fixture
def source_tree(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for i in range(40):
        sub = root / f"pkg{i % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i}.py").write_text(python_source(i), encoding="utf-8")
    (root / "pkg0" / "notes.txt").write_text("not code", encoding="utf-8")
    (root / "tests").mkdir()
    (root / "tests" / "test_widget.py").write_text("def test():\n    pass\n", encoding="utf-8")
    (root / "site-packages").mkdir()
    (root / "site-packages" / "vendored.py").write_text("x = 1\n", encoding="utf-8")
    return root
