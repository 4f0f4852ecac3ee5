"""Split names ("train", "val", "test"; "validation" deprecated), old import paths, the optional TorchRec import."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from comera_lightning.data.code import CodeCorpusDataModule, split_documents
from comera_lightning.data.code.splits import split_of
from comera_lightning.data.code.files import CodeDocument
from comera_lightning.data.pairs import SentencePairDataModule, load_mnli_dir
from comera_lightning.data.splits import SPLITS, STAGE_SPLITS, SplitDict, resolve_split


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def mnli_dir(tmp_path: Path) -> Path:
    root = tmp_path / "mnli"
    root.mkdir()
    labels = ("entailment", "neutral", "contradiction")
    for name, n in (("train.tsv", 12), ("dev_matched.tsv", 6), ("dev_mismatched.tsv", 3)):
        rows = [f"the cat sat {i}\ta dog ran {i}\t{labels[i % 3]}" for i in range(n)]
        (root / name).write_text("sentence1\tsentence2\tgold_label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return root


def test_split_names() -> None:
    assert SPLITS == ("train", "val", "test")
    assert STAGE_SPLITS["fit"] == ("train", "val") and STAGE_SPLITS["validate"] == ("val",)
    assert all(resolve_split(name) == name for name in SPLITS)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        resolve_split("dev")


def test_validation_is_a_deprecated_alias_pointing_at_the_caller() -> None:
    with pytest.warns(DeprecationWarning, match="'validation' is deprecated; use 'val'") as record:
        assert resolve_split("validation", stacklevel=1) == "val"
    assert record[0].filename == __file__


def test_split_dict_answers_the_old_key_with_a_warning() -> None:
    parts = SplitDict({"train": [1], "val": [2], "test": [3]})
    with pytest.warns(DeprecationWarning, match="use 'val'") as record:
        assert parts["validation"] == [2]
    assert record[0].filename == __file__
    with pytest.raises(KeyError):
        parts["dev"]
    assert list(parts) == ["train", "val", "test"] and "validation" not in parts


def test_readers_return_val(mnli_dir: Path) -> None:
    splits = load_mnli_dir(mnli_dir)
    assert list(splits) == ["train", "val", "test"] and len(splits["val"]) == 6
    docs = [CodeDocument(f"f{i}.py", "x = 1\n") for i in range(20)]
    assert set(split_documents(docs, 0.3, 0.3)) == {"train", "val", "test"}
    assert {split_of(d.key, 0.3, 0.3) for d in docs} == {"train", "val", "test"}


def test_sentence_pair_methods_accept_validation_with_a_warning(mnli_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_dir), batch_size=4, vocab_size=60)
    with pytest.warns(DeprecationWarning, match="use 'val'") as record:
        counts = dm.class_counts("validation")
    assert record[0].filename == __file__
    assert counts == dm.class_counts("val") == dm.class_counts() == {"entailment": 2, "neutral": 2, "contradiction": 2}
    with pytest.warns(DeprecationWarning, match="use 'val'") as record:
        data = dm.dataset("validation")
    assert record[0].filename == __file__
    assert data is dm.dataset("val") and len(data) == 6
    with pytest.warns(DeprecationWarning):
        assert dm.splits["validation"] is dm.splits["val"]


def test_code_corpus_accepts_validation_with_a_warning(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + 1\n" * 5, encoding="utf-8")
    dm = CodeCorpusDataModule(source_dirs=[str(tmp_path)], block_size=16, batch_size=4, vocab_size=300,
                              val_fraction=0.2, test_fraction=0.2)
    with pytest.warns(DeprecationWarning):
        assert dm.documents["validation"] is dm.documents["val"]
    with pytest.warns(DeprecationWarning):
        assert dm.dataset("validation") is dm.dataset("val")


def test_synthetic_criteo_accepts_validation_with_a_warning() -> None:
    pytest.importorskip("torchrec")
    from comera_lightning.data.criteo import SyntheticCriteoDataModule

    dm = SyntheticCriteoDataModule(batch_size=4, num_batches=2, val_batches=3, table_sizes=[10, 20])
    with pytest.warns(DeprecationWarning):
        assert len(dm.dataset("validation")) == len(dm.dataset("val")) == 3
    with pytest.raises(ValueError, match="unknown split"):
        dm.dataset("dev")


@pytest.mark.parametrize("package", ["comera_lightning.data", "comera_lightning.data.pairs", "comera_lightning.data.code",
                                     "comera_lightning.data.criteo", "comera_lightning.data.movielens"])
def test_each_data_package_has_its_public_names(package: str) -> None:
    if package.rsplit(".", 1)[-1] in ("criteo", "movielens"):
        pytest.importorskip("torchrec")
    loaded = importlib.import_module(package)
    assert loaded.__all__ and not [name for name in loaded.__all__ if not hasattr(loaded, name)]


def test_package_import_does_not_import_torchrec() -> None:
    code = "import sys, comera_lightning.data as d; assert 'torchrec' not in sys.modules; d.ClickBatch; print('ok')"
    if importlib.util.find_spec("torchrec") is None:
        code = "import sys, comera_lightning.data as d; assert 'torchrec' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_click_logs_without_torchrec_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchrec.sparse.jagged_tensor", None)  # `import` of it raises ImportError
    monkeypatch.setitem(sys.modules, "torchrec.modules.embedding_configs", None)
    monkeypatch.delitem(sys.modules, "comera_lightning.data.click_logs", raising=False)
    with pytest.raises(ImportError, match=r"click-log data.*needs torchrec: pip install 'comera_lightning\[recsys\]'"):
        importlib.import_module("comera_lightning.data.click_logs")
