"""CodeCorpusDataModule: user folders end to end, limits, cached or given tokenizers, unreadable files, the causal objective."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from comera_lightning.data.code import CodeCorpusDataModule, list_source_files
from tests.helpers.code_files import python_source


def test_user_dirs_end_to_end(source_tree: Path) -> None:
    (source_tree / "pkg1" / "latin.py").write_bytes(b"name = 'caf\xe9'\n")  # not UTF-8, no coding cookie
    (source_tree / "pkg2" / "cookie.py").write_bytes(b"# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n")
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable source file.*latin\.py") as record:
        dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], block_size=32, batch_size=8, vocab_size=300,
                                  val_fraction=0.2, test_fraction=0.2)
        docs = dm.documents
    assert len([w for w in record if "unreadable" in str(w.message)]) == 1
    keys = sorted(d.key for split in docs.values() for d in split)
    assert len(keys) == 41 and "pkg2/cookie.py" in keys  # a PEP 263 cookie is honoured
    assert not any("tests/" in k or "site-packages" in k or k.endswith(".txt") for k in keys)
    assert all(docs[s] for s in ("train", "val", "test"))

    assert (dm.vocab_size, dm.pad_token_id, dm.mask_token_id) == (300, 1, 4)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (8, 32)
    assert torch.all(batch["labels"][batch["input_ids"] == 0] == -100)
    assert torch.all(dm.dataset("train").blocks[:, 0] == 0)  # every block starts with <s>
    n_docs = len(docs["train"])
    assert int((dm.dataset("train").blocks == 2).sum()) == n_docs  # one </s> after every document

    # evaluation masks are drawn once: two passes give the same batches
    first = [b["input_ids"] for b in dm.val_dataloader()]
    second = [b["input_ids"] for b in dm.val_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert any((b["labels"] != -100).any() for b in dm.val_dataloader())


def test_limits_and_missing_dir(source_tree: Path, tmp_path: Path) -> None:
    dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], max_files=7)
    assert sum(len(v) for v in dm.documents.values()) == 7
    size = len(python_source(10).encode())
    dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], max_bytes=5 * size + 50)
    assert sum(len(v) for v in dm.documents.values()) == 5
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        list_source_files([tmp_path / "no_such_dir"], [".py"])


def test_module_uses_cached_and_user_tokenizers(source_tree: Path, tmp_path: Path) -> None:
    dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], vocab_size=300)
    dm.prepare_data()
    cached = list((tmp_path / "cache" / "tokenizers").glob("*.json"))
    assert len(cached) == 1
    user = CodeCorpusDataModule(source_dirs=[str(source_tree)], tokenizer_file=str(cached[0]),
                                cache_dir=str(tmp_path / "other"))
    assert user.vocab_size == dm.vocab_size and not (tmp_path / "other").exists()
    bad = tmp_path / "wordpiece.json"
    from comera_lightning.data.tokenizer import load_or_train_wordpiece

    load_or_train_wordpiece(lambda: iter(["some words here"] * 5), vocab_size=40).save(str(bad))
    with pytest.raises(ValueError, match="lacks the special tokens"):
        _ = CodeCorpusDataModule(source_dirs=[str(source_tree)], tokenizer_file=str(bad)).vocab_size


def test_no_warning_when_everything_is_readable(source_tree: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm = CodeCorpusDataModule(source_dirs=[str(source_tree)])
        assert dm.documents and dm.skipped_files == []
    assert np.isclose(dm.mlm_probability, 0.15)


def test_causal_objective_labels_every_real_token(source_tree):
    dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], block_size=32, batch_size=4, vocab_size=300,
                              val_fraction=0.2, test_fraction=0.0, objective="clm")
    dm.prepare_data()
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        batch = next(iter(loader))
        real = batch["attention_mask"].bool()
        assert torch.equal(batch["labels"][real], batch["input_ids"][real])
        assert (batch["labels"][~real] == -100).all()
    with pytest.raises(ValueError, match="objective='causal'"):
        CodeCorpusDataModule(source_dirs=[str(source_tree)], objective="causal")
