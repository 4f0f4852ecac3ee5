"""Tests of TokenizedTextDataModule, the base of the tokenized-text data modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.nn.utils.rnn import pad_sequence

from comera_lightning.data import CodeCorpusDataModule, SentencePairDataModule, TokenizedTextDataModule

TEXTS = {
    "train": [f"the cat sat {i}" for i in range(10)],
    "val": ["a dog ran", "the dog sat", "a cat ran"],
    "test": ["the end"],
}
WORDS = ["[PAD]", "[UNK]", "the", "cat", "sat", "a", "dog", "ran", "end", *map(str, range(10))]


class ToyText(TokenizedTextDataModule):
    """A minimal subclass: a word-level tokenizer and one id tensor per text."""

    def __init__(self, batch_size: int = 4, eval_batch_size: int | None = None, seed: int = 0,
                 num_workers: int = 0, drop_last: bool = False, pad_missing: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.built: list[str] = []
        self.tokenizers_built = 0

    def _build_tokenizer(self) -> Tokenizer:
        self.tokenizers_built += 1
        words = WORDS[1:] if self.hparams.pad_missing else WORDS
        tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        return tokenizer

    def _build_dataset(self, split: str) -> list[torch.Tensor]:
        self.built.append(split)
        return [torch.tensor(self.tokenizer.encode(text).ids) for text in TEXTS[split]]

    def collate_fn(self, split: str):
        pad = self.pad_token_id
        return lambda items: pad_sequence(items, batch_first=True, padding_value=pad)


def test_subclasses_share_the_base() -> None:
    assert issubclass(SentencePairDataModule, TokenizedTextDataModule)
    assert issubclass(CodeCorpusDataModule, TokenizedTextDataModule)
    assert SentencePairDataModule.pad_token == "[PAD]" and CodeCorpusDataModule.pad_token == "<pad>"


def test_tokenizer_is_built_once_and_gives_metadata() -> None:
    dm = ToyText()
    assert dm.tokenizers_built == 0  # nothing is built in __init__
    dm.prepare_data()
    assert dm.vocab_size == len(WORDS) and dm.pad_token_id == 0
    _ = dm.tokenizer
    assert dm.tokenizers_built == 1


def test_missing_pad_token_is_named() -> None:
    with pytest.raises(ValueError, match=r"no '\[PAD\]' token"):
        _ = ToyText(pad_missing=True).pad_token_id


@pytest.mark.parametrize(("stage", "splits"), [
    ("fit", ["train", "val"]), ("validate", ["val"]), ("test", ["test"]), ("predict", ["test"]),
    (None, ["train", "val", "test"]),
])
def test_setup_builds_the_stage_splits_once(stage: str | None, splits: list[str]) -> None:
    dm = ToyText()
    dm.setup(stage)
    dm.setup(stage)
    assert dm.built == splits
    assert dm.dataset(splits[0]) is dm.dataset(splits[0])


def test_loaders_batch_sizes_and_order() -> None:
    dm = ToyText(batch_size=4, seed=3)
    assert dm.batch_size == dm.eval_batch_size == 4
    train = [b for b in dm.train_dataloader()]
    assert [len(b) for b in train] == [4, 4, 2]
    again = [b for b in ToyText(batch_size=4, seed=3).train_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(train, again))  # seeded shuffle
    val = next(iter(dm.val_dataloader()))
    assert val.shape == (3, 3) and val[0].tolist() == [5, 6, 7]  # in order: "a dog ran"
    assert len(dm.test_dataloader()) == len(dm.predict_dataloader()) == 1

    dm = ToyText(batch_size=4, eval_batch_size=2, drop_last=True)
    assert [len(b) for b in dm.train_dataloader()] == [4, 4]
    assert [len(b) for b in dm.val_dataloader()] == [2, 1]


def test_hyperparameters_are_read_not_copied() -> None:
    dm = ToyText(batch_size=4)
    assert dm.hparams.batch_size == 4 and "batch_size" not in vars(dm)
    dm.batch_size = 5  # what Lightning's batch-size finder does
    assert dm.hparams.batch_size == 5 and dm.eval_batch_size == 5
    assert [len(b) for b in dm.train_dataloader()] == [5, 5]


def test_real_modules_keep_their_arguments_in_hparams(tmp_path: Path) -> None:
    sp = SentencePairDataModule(source="mnli", data_dir=str(tmp_path), batch_size=8, max_length=32, vocab_size=300)
    assert (sp.batch_size, sp.eval_batch_size, sp.max_length) == (8, 8, 32)
    assert sp.hparams.vocab_size == 300 and sp.hparams.source == "mnli"
    assert not {"source", "data_dir", "batch_size", "max_length", "seed"} & set(vars(sp))
    code = CodeCorpusDataModule(block_size=16, batch_size=4, eval_batch_size=6, mlm_probability=0.2)
    assert (code.block_size, code.batch_size, code.eval_batch_size, code.mlm_probability) == (16, 4, 6, 0.2)
    assert not {"block_size", "extensions", "mlm_probability", "seed"} & set(vars(code))


def test_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown split 'dev'.*'train', 'val', 'test'"):
        ToyText().dataset("dev")
