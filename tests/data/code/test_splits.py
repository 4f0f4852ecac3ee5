"""Code-corpus splits: by file, deterministic, never empty for a tiny corpus."""

from __future__ import annotations

from pathlib import Path

from comera_lightning.data.code import CodeCorpusDataModule, split_documents
from tests.helpers.code_files import python_source


def test_split_is_by_file_and_deterministic(source_tree: Path) -> None:
    def splits() -> dict[str, set[str]]:
        dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], vocab_size=300, val_fraction=0.2,
                                  test_fraction=0.2)
        return {k: {d.key for d in v} for k, v in dm.documents.items()}

    a, b = splits(), splits()
    assert a == b
    assert not (a["train"] & a["val"]) and not (a["train"] & a["test"]) and not (a["val"] & a["test"])
    # adding a file never moves the others
    (source_tree / "pkg3" / "extra.py").write_text(python_source(99), encoding="utf-8")
    c = splits()
    assert all(a[s] <= c[s] for s in a)


def test_tiny_corpus_still_has_eval_splits() -> None:
    from comera_lightning.data.code import CodeDocument

    docs = [CodeDocument(f"f{i}.py", "x = 1\n") for i in range(3)]
    parts = split_documents(docs, 0.01, 0.01)
    assert all(len(parts[s]) == 1 for s in ("train", "val", "test"))
