"""The tokenizers trained once and cached: WordPiece and byte-level BPE, reused until their inputs change."""

from __future__ import annotations

from pathlib import Path

import pytest

from comera_lightning.data.tokenizer import default_cache_dir, load_or_train_bytelevel_bpe, load_or_train_wordpiece
from tests.helpers.code_files import python_source
from tests.helpers.pair_files import WORDS


def test_wordpiece_cache_reused_and_retrained_on_change(tmp_path: Path) -> None:
    calls = []
    corpus = [f"Sentence number {i} about {w}" for i, w in enumerate(WORDS * 3)]

    def factory(texts: list[str]):
        def make():
            calls.append(1)
            return iter(texts)
        return make

    cache = tmp_path / "tok"
    first = load_or_train_wordpiece(factory(corpus), vocab_size=120, cache_path=cache)
    assert len(calls) == 2  # fingerprint + training
    files = list((cache / "tokenizers").glob("*.json"))
    assert len(files) == 1 and "vocab120" in files[0].name
    mtime = files[0].stat().st_mtime_ns

    calls.clear()
    second = load_or_train_wordpiece(factory(corpus), vocab_size=120, cache_path=cache)
    assert len(calls) == 1 and files[0].stat().st_mtime_ns == mtime  # only fingerprinted, not retrained
    assert second.get_vocab() == first.get_vocab()

    load_or_train_wordpiece(factory(corpus + ["a brand new line"]), vocab_size=120, cache_path=cache)
    load_or_train_wordpiece(factory(corpus), vocab_size=100, cache_path=cache)
    assert len(list((cache / "tokenizers").glob("*.json"))) == 3

    enc = first.encode("The CAT", "sat")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    assert first.decode(enc.ids) == "the cat sat"  # lower-cased; decode drops the special tokens
    first_sep = enc.tokens.index("[SEP]")
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.ids) - first_sep - 1)
    assert [first.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]


def test_default_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_cache_dir() == tmp_path / "cache"  # from the autouse fixture's env var
    assert default_cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("COMERA_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "comera_lightning"


SPECIAL = [0, 1, 2, 3, 4]  # <s>, <pad>, </s>, <unk>, <mask>


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
