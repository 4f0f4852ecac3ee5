"""Tests of the code corpus: masking statistics, packing, tokenizer cache, unreadable files, JSONL input."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from comera_lightning.data.code import (
    CodeCorpusDataModule,
    MLMCollator,
    list_source_files,
    pack_blocks,
    read_code_jsonl,
    split_documents,
    stdlib_dir,
)
from comera_lightning.data.tokenizer import load_or_train_bytelevel_bpe

SPECIAL = [0, 1, 2, 3, 4]  # <s>, <pad>, </s>, <unk>, <mask>
MASK_ID = 4


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path / "cache"))


def python_source(i: int) -> str:
    return (
        f"import os\n\n\nclass Widget{i}:\n    \"\"\"A widget number {i}.\"\"\"\n\n"
        f"    def __init__(self, size: int = {i}) -> None:\n        self.size = size\n\n"
        f"    def area(self) -> int:\n        return self.size * self.size + {i}\n\n\n"
        f"def helper_{i}(path):\n    for name in os.listdir(path):\n        if name.endswith('.py'):\n"
        f"            yield os.path.join(path, name)\n"
    )


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


# --------------------------------------------------------------------------- masking


def test_masking_statistics_on_a_large_batch() -> None:
    torch.manual_seed(0)
    vocab = 1000
    ids = torch.randint(5, vocab, (64, 512))
    ids[:, 0] = 0  # <s>
    ids[:, 100::50] = 2  # </s> separators
    ids[:, 10:20] = 3  # <unk>
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[-8:, 300:] = False
    ids[~attention] = 1  # <pad>
    collator = MLMCollator(MASK_ID, vocab, SPECIAL, generator=torch.Generator().manual_seed(1))
    items = [{"input_ids": i, "attention_mask": a} for i, a in zip(ids, attention)]
    batch = collator(items)

    special = torch.isin(ids, torch.tensor(SPECIAL)) | ~attention
    selected = batch["labels"] != -100
    assert not selected[special].any()  # special tokens and padding are never selected
    assert torch.equal(batch["labels"][selected], ids[selected])
    rate = selected.sum().item() / (~special).sum().item()
    assert abs(rate - 0.15) < 0.01

    out = batch["input_ids"][selected]
    original = ids[selected]
    masked = (out == MASK_ID).float().mean().item()
    kept = (out == original).float().mean().item()
    randomised = ((out != MASK_ID) & (out != original)).float().mean().item()
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(randomised - 0.1) < 0.015
    assert not torch.isin(out[out != MASK_ID], torch.tensor(SPECIAL)).any()  # random tokens are never special
    assert torch.equal(batch["input_ids"][~selected], ids[~selected])  # unselected tokens untouched
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool


def test_masking_is_dynamic_and_seeded() -> None:
    ids = torch.randint(5, 100, (4, 64))
    attention = torch.ones_like(ids, dtype=torch.bool)
    collator = MLMCollator(MASK_ID, 100, SPECIAL)
    first, _ = collator.mask(ids, attention, torch.Generator().manual_seed(0))
    again, _ = collator.mask(ids, attention, torch.Generator().manual_seed(0))
    other, _ = collator.mask(ids, attention, torch.Generator().manual_seed(1))
    assert torch.equal(first, again) and not torch.equal(first, other)
    with pytest.raises(ValueError, match="mlm_probability"):
        MLMCollator(MASK_ID, 100, SPECIAL, mlm_probability=1.5)


# --------------------------------------------------------------------------- packing


def test_pack_blocks_separates_documents_and_pads_the_tail() -> None:
    blocks, lengths = pack_blocks([[5, 6, 7], [8, 9]], 4, bos_id=0, sep_id=2, pad_id=1)
    assert blocks.tolist() == [[0, 5, 6, 7], [0, 2, 8, 9], [0, 2, 1, 1]]
    assert lengths.tolist() == [4, 4, 2]
    blocks, lengths = pack_blocks([[5, 6], [7]], 6, bos_id=0, sep_id=2, pad_id=1)
    assert blocks.tolist() == [[0, 5, 6, 2, 7, 2]] and lengths.tolist() == [6]


# --------------------------------------------------------------------------- user directories


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


def test_limits_and_missing_dir(source_tree: Path, tmp_path: Path) -> None:
    dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], max_files=7)
    assert sum(len(v) for v in dm.documents.values()) == 7
    size = len(python_source(10).encode())
    dm = CodeCorpusDataModule(source_dirs=[str(source_tree)], max_bytes=5 * size + 50)
    assert sum(len(v) for v in dm.documents.values()) == 5
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        list_source_files([tmp_path / "no_such_dir"], [".py"])


def test_stdlib_default_corpus() -> None:
    dm = CodeCorpusDataModule(max_files=12, vocab_size=400)
    docs = [d for split in dm.documents.values() for d in split]
    assert len(docs) == 12
    assert all(d.key.endswith(".py") and "site-packages" not in d.key for d in docs)
    assert all(not set(d.key.split("/")[:-1]) & {"test", "tests", "idle_test"} for d in docs)
    assert (stdlib_dir() / docs[0].key).is_file()


# --------------------------------------------------------------------------- tokenizer cache


def test_bpe_cache_reused_and_retrained_on_change(tmp_path: Path) -> None:
    calls: list[int] = []
    corpus = [python_source(i) for i in range(20)]

    def factory(texts: list[str]):
        def make():
            calls.append(1)
            return iter(texts)
        return make

    first = load_or_train_bytelevel_bpe(factory(corpus), vocab_size=320, cache_path=tmp_path)
    assert len(calls) == 2
    calls.clear()
    second = load_or_train_bytelevel_bpe(factory(corpus), vocab_size=320, cache_path=tmp_path)
    assert len(calls) == 1 and second.get_vocab() == first.get_vocab()
    load_or_train_bytelevel_bpe(factory(corpus[:-1]), vocab_size=320, cache_path=tmp_path)
    assert len(list((tmp_path / "tokenizers").glob("bytelevel-bpe-*.json"))) == 2
    assert [first.token_to_id(t) for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")] == SPECIAL
    text = "def f(x):\n    return x  # ünïcode\n"
    assert first.decode(first.encode(text, add_special_tokens=False).ids) == text  # byte-level round trip
    with pytest.raises(ValueError, match="vocab_size"):
        load_or_train_bytelevel_bpe(factory(corpus), vocab_size=100, cache_path=tmp_path)


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


# --------------------------------------------------------------------------- JSONL


def test_jsonl_source_plain_and_gzip(tmp_path: Path) -> None:
    records = [{"repo": "me/r", "path": f"src/m{i // 2}.py", "func_name": f"f{i}", "code": python_source(i)}
               for i in range(30)]
    plain = tmp_path / "train.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in records[:20]), encoding="utf-8")
    zipped = tmp_path / "more.jsonl.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as handle:
        for r in records[20:]:
            handle.write(json.dumps({"original_string": r["code"]}) + "\n")
    docs = read_code_jsonl(zipped)
    assert len(docs) == 10 and docs[0].key == "more.jsonl.gz:1"

    dm = CodeCorpusDataModule(jsonl_files=[str(plain), str(zipped)], vocab_size=300, block_size=64,
                              batch_size=4, val_fraction=0.2, test_fraction=0.2)
    split = {d.key: name for name, part in dm.documents.items() for d in part}
    assert len([d for part in dm.documents.values() for d in part]) == 30
    assert split.get("me/r/src/m0.py") is not None  # functions of one file share a key, hence a split
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 64)
    assert CodeCorpusDataModule(jsonl_files=[str(plain)], max_files=5).documents is not None
    assert sum(len(v) for v in CodeCorpusDataModule(jsonl_files=[str(plain)], max_files=5).documents.values()) == 5


def test_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"code": "x = 1"}\n{"code": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: invalid JSON"):
        read_code_jsonl(path)
    path.write_text('{"code": "x = 1"}\n{"docstring": "no code"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: no string field `code` or `original_string`"):
        read_code_jsonl(path)
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        read_code_jsonl(tmp_path / "absent.jsonl")


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
