"""`TextFilesDataModule`: causal-LM batches from a user's text files (C4 shards, JSON lines, plain text).

Training reads the training files in order (sorted by name) and validation the held-out files: ``val_files``, or
else the last training file (C4: pass ``c4-validation.*.json.gz``). The tokenizer is a user ``tokenizer.json`` or a
byte-level BPE trained once on the first ``tokenizer_chars`` characters of training text and cached. Documents are
tokenized by the chunk, packed into blocks of ``block_size`` tokens (``<s>`` first, or ``</s>`` for a tokenizer
without ``<s>`` such as T5's; ``</s>`` between documents), up to ``max_train_tokens`` / ``max_val_tokens`` tokens.

Batches: ``input_ids`` and ``labels`` (long, ``[batch, block_size]``; labels -100 on padding, unshifted as Hugging
Face causal LMs expect) and ``attention_mask`` (bool). There is no test split.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from itertools import islice

import numpy as np
from tokenizers import Tokenizer

from comera_lightning.data.code.batching import CausalLMCollator, PackedBlocks, pack_blocks
from comera_lightning.data.text.files import held_out, read_documents, text_files
from comera_lightning.data.text_base import TokenizedTextDataModule
from comera_lightning.data.tokenizer import fingerprint_files, load_or_train_bytelevel_bpe, load_tokenizer_file

__all__ = ["CLM_TOKENS", "TextFilesDataModule"]

log = logging.getLogger(__name__)

#: The tokens a user tokenizer needs: padding and the separator between documents.
CLM_TOKENS = ("<pad>", "</s>")
_CHUNK = 2_000  # documents tokenized at a time (their encodings are dropped once packed)


class TextFilesDataModule(TokenizedTextDataModule):
    """Causal-LM batches from text files, validated on held-out files.

    Args:
        train_files: files, folders or glob patterns (``.jsonl``/``.json`` JSON lines, ``.txt``; ``.gz`` allowed).
        val_files: held-out files the same way; default: the last training file.
        text_field: the JSON field that holds a document's text.
        block_size: tokens per packed block, the first token included.
        batch_size: training batch size; eval_batch_size: validation's (default ``batch_size``).
        vocab_size: the byte-level BPE's vocabulary when one is trained (at least 261).
        tokenizer_file: a user ``tokenizer.json`` with ``<pad>`` and ``</s>`` (T5's has them) instead.
        tokenizer_chars: characters of training text the BPE learns from (the first documents').
        cache_dir: the tokenizer cache (default ``$COMERA_CACHE_DIR`` or ``~/.cache/comera_lightning``).
        max_train_tokens: stop reading the training documents once they hold this many tokens.
        max_val_tokens: the same for the validation documents.
        seed: the training shuffle's seed.
        num_workers: loader workers.
        drop_last: drop an incomplete last batch.
    """

    pad_token = "<pad>"

    def __init__(self, train_files: list[str], val_files: list[str] | None = None, text_field: str = "text",
                 block_size: int = 256, batch_size: int = 32, eval_batch_size: int | None = None,
                 vocab_size: int = 32_000, tokenizer_file: str | None = None, tokenizer_chars: int = 100_000_000,
                 cache_dir: str | None = None, max_train_tokens: int | None = None, max_val_tokens: int | None = None,
                 seed: int = 0, num_workers: int = 0, drop_last: bool = False) -> None:
        super().__init__()
        _check_sizes(block_size=block_size, batch_size=batch_size, tokenizer_chars=tokenizer_chars,
                     max_train_tokens=max_train_tokens, max_val_tokens=max_val_tokens)
        if not train_files:
            raise ValueError("train_files is empty: name the training text files (files, folders or glob patterns)")
        self.save_hyperparameters()
        self.files = dict(zip(("train", "val"), held_out(text_files(train_files),
                                                           text_files(val_files) if val_files else None)))
        self.tokens: dict[str, int] = {}  # tokens each split holds once built

    @property
    def block_size(self) -> int:
        """Tokens per packed block."""
        return self.hparams.block_size

    def setup(self, stage: str | None = None) -> None:
        """Build the training and validation blocks ("fit", the default) or the validation ones ("validate")."""
        super().setup(stage or "fit")

    def collate_fn(self, split: str) -> CausalLMCollator:
        """Next-token labels for every split."""
        return CausalLMCollator()

    def documents(self, split: str) -> Iterator[str]:
        """The documents of ``split`` ("train" or "val"), read lazily in file order."""
        if split not in self.files:
            raise ValueError(f"TextFilesDataModule has no {split!r} split: it holds out files for validation only "
                             "(use trainer.validate, or give the test files as val_files of another module)")
        return read_documents(self.files[split], self.hparams.text_field)

    def _build_tokenizer(self) -> Tokenizer:
        hp = self.hparams
        if hp.tokenizer_file is not None:
            return _plain(load_tokenizer_file(hp.tokenizer_file, CLM_TOKENS))

        def sample() -> Iterator[str]:
            budget = hp.tokenizer_chars
            for text in self.documents("train"):
                if budget <= 0:
                    return
                yield text[:budget]
                budget -= len(text)

        fingerprint = f"{fingerprint_files(self.files['train'])}-{hp.tokenizer_chars}-{hp.text_field}"
        return _plain(load_or_train_bytelevel_bpe(sample, vocab_size=hp.vocab_size, cache_path=hp.cache_dir,
                                                  fingerprint=fingerprint))

    def _build_dataset(self, split: str) -> PackedBlocks:
        limit = self.hparams.max_train_tokens if split == "train" else self.hparams.max_val_tokens
        pieces, total, docs = [], 0, self.documents(split)
        while limit is None or total < limit:
            chunk = list(islice(docs, _CHUNK))
            if not chunk:
                break
            for encoding in self.tokenizer.encode_batch(chunk, add_special_tokens=False):
                pieces.append(np.asarray(encoding.ids, dtype=np.int32))
                total += len(pieces[-1]) + 1  # and the separator
                if limit is not None and total >= limit:
                    break
        bos = self.tokenizer.token_to_id("<s>")
        sep = self._token_id("</s>")
        blocks, lengths = pack_blocks(pieces, self.block_size, bos_id=sep if bos is None else bos, sep_id=sep,
                                      pad_id=self.pad_token_id)
        self.tokens[split] = int(lengths.sum())
        log.info("text %s: %d documents of %s -> %d blocks of %d tokens", split, len(pieces),
                 ", ".join(os.fspath(p) for p in self.files[split][:3]), len(blocks), self.block_size)
        return PackedBlocks(blocks, lengths)


def _plain(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with no truncation and no padding (blocks are packed here)."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _check_sizes(**sizes: int | None) -> None:
    """A ValueError naming the first size that is set but too small."""
    least = {"block_size": 8}
    for name, value in sizes.items():
        if value is not None and value < least.get(name, 1):
            raise ValueError(f"{name} must be >= {least.get(name, 1)}, got {value}")
