"""TextFilesDataModule: C4-style shards end to end, the held-out file, token limits, a user tokenizer without <s>."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from comera_lightning.data import TextFilesDataModule
from tests.data.text.conftest import sentences


def module(c4_dir: Path, tmp_path: Path, **options) -> TextFilesDataModule:
    return TextFilesDataModule([str(c4_dir)], block_size=16, batch_size=4, vocab_size=300,
                               cache_dir=str(tmp_path / "cache"), **options)


def test_shards_end_to_end_with_the_last_one_held_out(c4_dir: Path, tmp_path: Path) -> None:
    dm = module(c4_dir, tmp_path)
    dm.setup("fit")
    assert dm.vocab_size == 300 and dm.pad_token_id == 1
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (4, 16)
    assert torch.equal(batch["labels"][batch["attention_mask"]], batch["input_ids"][batch["attention_mask"]])
    train, val = dm.dataset("train").blocks, dm.dataset("val").blocks
    assert torch.all(train[:, 0] == 0) and int((train == 2).sum()) == 60  # <s> first; one </s> per document
    assert dm.tokens["train"] == int(dm.dataset("train").attention_mask.sum())
    val_text = dm.tokenizer.decode(val.flatten().tolist())
    assert "shard2" in val_text and "shard0" not in val_text and "shard1" not in val_text
    with pytest.raises(ValueError, match=r"no 'test' split: it holds out files for validation only"):
        dm.setup("test")


def test_a_token_limit_stops_reading(c4_dir: Path, tmp_path: Path) -> None:
    whole = module(c4_dir, tmp_path)
    whole.setup("fit")
    limited = module(c4_dir, tmp_path, max_train_tokens=100, max_val_tokens=50)
    limited.setup("fit")
    document = 1 + max(len(whole.tokenizer.encode(text, add_special_tokens=False).ids)
                       for shard in range(3) for text in sentences(shard, 30))  # the longest, and its </s>
    assert 100 <= limited.tokens["train"] - len(limited.dataset("train")) < 100 + document  # <s> of each block aside
    assert 50 <= limited.tokens["val"] - len(limited.dataset("val")) < 50 + document < whole.tokens["val"]


def _t5_like(path: Path) -> Path:
    """A word-level tokenizer with <pad>, </s> and <unk> but no <s> (as T5's)."""
    words = sorted({w for text in sentences(0, 30) + sentences(1, 30) + sentences(2, 30) for w in text.split()})
    vocab = {token: i for i, token in enumerate(["<pad>", "</s>", "<unk>", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return path


def test_a_user_tokenizer_without_bos_starts_blocks_with_the_separator(c4_dir: Path, tmp_path: Path) -> None:
    dm = module(c4_dir, tmp_path, tokenizer_file=str(_t5_like(tmp_path / "tokenizer.json")))
    dm.setup("fit")
    blocks = dm.dataset("train").blocks
    assert dm.pad_token_id == 0 and torch.all(blocks[:, 0] == 1)
    assert not (tmp_path / "cache").exists()  # nothing trained


def test_a_user_tokenizer_needs_pad_and_separator(c4_dir: Path, tmp_path: Path) -> None:
    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tokenizer.save(str(tmp_path / "bare.json"))
    with pytest.raises(ValueError, match=r"lacks the special tokens \['<pad>', '</s>'\]"):
        module(c4_dir, tmp_path, tokenizer_file=str(tmp_path / "bare.json")).prepare_data()


def test_bad_arguments_are_named(c4_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"train_files is empty"):
        TextFilesDataModule([])
    with pytest.raises(ValueError, match=r"max_train_tokens must be >= 1, got 0"):
        module(c4_dir, tmp_path, max_train_tokens=0)
    with pytest.raises(ValueError, match=r"block_size must be >= 8, got 4"):
        TextFilesDataModule([str(c4_dir)], block_size=4)
