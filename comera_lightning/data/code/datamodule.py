"""`CodeCorpusDataModule`: language-model pre-training batches from source code (masked, CodeBERT-style, or causal).

It reads a code corpus (`files.py`), splits it by file (a hash of each file's relative path
picks train / val / test, so a file never straddles splits: `splits.py`), trains a
byte-level BPE tokenizer on the training files (cached), packs the token stream into fixed blocks
of `block_size` tokens (`<s>` first, `</s>` between documents) and masks tokens on the fly
(`objective="mlm"`) or labels every real token for next-token prediction (`objective="clm"`)
(`batching.py`).

Corpora:

* default: the Python standard library on this machine (`sysconfig.get_paths()["stdlib"]`, `*.py`,
  never `site-packages`, test folders excluded unless `exclude_tests=False`);
* `source_dirs` (+ `extensions`): any folders of source files;
* `jsonl_files`: CodeSearchNet-style JSONL (optionally `.gz`), one record per line with a `code`
  or `original_string` field (records with `repo`/`path` are split by that path).

Batches: `input_ids` (long, `[batch, block_size]`), `attention_mask` (bool, True on real tokens) and
`labels` (long; "mlm": the original token where one was selected for prediction, -100 elsewhere;
"clm": the input ids, -100 on padding, unshifted as Hugging Face causal LMs expect).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from tokenizers import Tokenizer

from comera_lightning.data.code.batching import CausalLMCollator, MLMCollator, PackedBlocks, pack_blocks
from comera_lightning.data.code.files import CodeDocument, list_source_files, read_code_jsonl, read_source_documents, stdlib_dir
from comera_lightning.data.code.splits import split_documents, unit_hash
from comera_lightning.data.splits import SPLITS, check_split_fractions
from comera_lightning.data.text_base import TokenizedTextDataModule
from comera_lightning.data.tokenizer import BPE_SPECIAL_TOKENS, load_or_train_bytelevel_bpe

__all__ = ["OBJECTIVES", "CodeCorpusDataModule"]

log = logging.getLogger(__name__)

_MAX_NAMED_IN_WARNING = 20
OBJECTIVES = ("mlm", "clm")


class CodeCorpusDataModule(TokenizedTextDataModule):
    """Masked- or causal-LM batches from a code corpus (the local Python stdlib by default) with a cached byte-level BPE.

    Args:
        source_dirs: folders of source files to read instead of the standard library.
        extensions: file name endings to read from `source_dirs` (and the stdlib).
        jsonl_files: CodeSearchNet-style JSONL files (`.jsonl` or `.jsonl.gz`) with a `code` or
            `original_string` field; combined with `source_dirs` when both are given.
        exclude_tests: skip folders named `test`, `tests` or `idle_test`.
        block_size: tokens per packed block, `<s>` included.
        batch_size: training batch size.
        eval_batch_size: validation/test batch size (default: `batch_size`).
        mlm_probability: fraction of non-special tokens selected for prediction (`objective="mlm"`).
        objective: `"mlm"` (masked tokens, CodeBERT-style) or `"clm"` (next-token labels on every real token).
        vocab_size: byte-level BPE vocabulary size when training a tokenizer (at least 261).
        tokenizer_file: a user `tokenizer.json` (with <s>, <pad>, </s>, <unk>, <mask>) to use instead.
        cache_dir: tokenizer cache folder (default `$COMERA_CACHE_DIR` or `~/.cache/comera_lightning`).
        max_files: use at most this many documents (files or JSONL records); files are picked by a
            hash of their path, so the sample is spread over the whole tree.
        max_bytes: stop adding source files once their total size would exceed this.
        val_fraction: fraction of files (by path hash) for validation.
        test_fraction: fraction of files (by path hash) for test.
        seed: seed of the split hash, the training shuffle and the evaluation masks.
        num_workers: DataLoader worker processes.
        drop_last: drop the last incomplete training batch.

    The arguments are read back from ``self.hparams``; ``vocab_size`` (the property) is the
    size of the tokenizer actually built, ``hparams.vocab_size`` the size asked for. Training
    blocks get fresh masks every time they are drawn; validation and test masks are drawn once.
    """

    pad_token = "<pad>"

    def __init__(
        self,
        source_dirs: list[str] | None = None,
        extensions: list[str] | None = None,
        jsonl_files: list[str] | None = None,
        exclude_tests: bool = True,
        block_size: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        mlm_probability: float = 0.15,
        vocab_size: int = 8192,
        tokenizer_file: str | None = None,
        cache_dir: str | None = None,
        max_files: int | None = None,
        max_bytes: int | None = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = False,
        objective: str = "mlm",
    ) -> None:
        super().__init__()
        _check_arguments(block_size, batch_size, val_fraction, test_fraction, max_files, max_bytes, mlm_probability)
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r} is not one of {OBJECTIVES} (masked or causal language modelling)")
        self.save_hyperparameters()
        self._documents: dict[str, list[CodeDocument]] | None = None
        self.skipped_files: list[str] = []

    # ---- metadata

    @property
    def block_size(self) -> int:
        """Tokens per packed block, `<s>` included."""
        return self.hparams.block_size

    @property
    def mlm_probability(self) -> float:
        """Fraction of non-special tokens selected for prediction."""
        return self.hparams.mlm_probability

    @property
    def documents(self) -> dict[str, list[CodeDocument]]:
        """The corpus documents of each split (read on first use)."""
        if self._documents is None:
            docs = self._read_corpus()
            if not docs:
                raise ValueError(f"the code corpus is empty ({self._describe_source()}); "
                                 "check source_dirs / extensions / jsonl_files")
            hp = self.hparams
            self._documents = split_documents(docs, hp.val_fraction, hp.test_fraction, hp.seed)
            log.info("code corpus (%s): %s documents", self._describe_source(),
                     {k: len(v) for k, v in self._documents.items()})
        return self._documents

    @property
    def mask_token_id(self) -> int:
        """Id of `<mask>`."""
        return self._token_id("<mask>")

    @property
    def special_token_ids(self) -> list[int]:
        """Ids of `<s>`, `<pad>`, `</s>`, `<unk>`, `<mask>` (never selected for masking)."""
        return [self._token_id(tok) for tok in BPE_SPECIAL_TOKENS]

    def collator(self, generator: torch.Generator | None = None) -> MLMCollator:
        """The dynamic-masking collate function of this corpus."""
        return MLMCollator(self.mask_token_id, self.vocab_size, self.special_token_ids,
                           mlm_probability=self.mlm_probability, generator=generator)

    def collate_fn(self, split: str) -> MLMCollator | CausalLMCollator:
        """`collator()` for every split (evaluation items carry their fixed masks and are only stacked)."""
        return CausalLMCollator() if self.hparams.objective == "clm" else self.collator()

    # ---- building

    def _build_tokenizer(self) -> Tokenizer:
        """The byte-level BPE tokenizer (trained on the training files and cached, or the user's file)."""
        train = self.documents["train"]
        tokenizer = load_or_train_bytelevel_bpe(
            lambda: (doc.text for doc in train), vocab_size=self.hparams.vocab_size,
            cache_path=self.hparams.cache_dir, tokenizer_file=self.hparams.tokenizer_file,
        )
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer

    def _build_dataset(self, split: str) -> PackedBlocks:
        """The packed blocks of a split; evaluation splits carry fixed masks."""
        docs = self.documents[split]
        if not docs:
            raise ValueError(f"the {split} split of the code corpus is empty ({self._describe_source()}); "
                             "use more files or a larger val_fraction/test_fraction")
        encodings = self.tokenizer.encode_batch([doc.text for doc in docs], add_special_tokens=False)
        blocks, lengths = pack_blocks([enc.ids for enc in encodings], self.block_size,
                                      bos_id=self._token_id("<s>"), sep_id=self._token_id("</s>"),
                                      pad_id=self.pad_token_id)
        dataset = PackedBlocks(blocks, lengths)
        if split != "train" and self.hparams.objective == "mlm":
            # Fixed evaluation masks make validation losses comparable across epochs and runs.
            generator = torch.Generator().manual_seed(self.hparams.seed + SPLITS.index(split))
            masked, labels = self.collator().mask(dataset.blocks.long(), dataset.attention_mask, generator)
            dataset = PackedBlocks(blocks, lengths, labels=labels, masked_ids=masked)
        log.info("code corpus %s: %d documents -> %d blocks of %d tokens", split, len(docs), len(dataset),
                 self.block_size)
        return dataset

    # ---- reading

    @property
    def _source_dirs(self) -> list[str] | None:
        return list(self.hparams.source_dirs) if self.hparams.source_dirs else None

    @property
    def _extensions(self) -> list[str]:
        return list(self.hparams.extensions) if self.hparams.extensions else [".py"]

    @property
    def _jsonl_files(self) -> list[str] | None:
        return list(self.hparams.jsonl_files) if self.hparams.jsonl_files else None

    def _describe_source(self) -> str:
        parts = []
        if self._source_dirs:
            parts.append(f"source_dirs={self._source_dirs} extensions={self._extensions}")
        if self._jsonl_files:
            parts.append(f"jsonl_files={self._jsonl_files}")
        return "; ".join(parts) or f"Python stdlib at {stdlib_dir()}"

    def _read_corpus(self) -> list[CodeDocument]:
        max_files = self.hparams.max_files
        docs: list[CodeDocument] = []
        if self._source_dirs or not self._jsonl_files:
            roots = self._source_dirs or [str(stdlib_dir())]
            docs.extend(self._read_files(list_source_files(roots, self._extensions, self.hparams.exclude_tests)))
        for path in self._jsonl_files or []:
            remaining = None if max_files is None else max_files - len(docs)
            if remaining is not None and remaining <= 0:
                break
            docs.extend(read_code_jsonl(path, remaining))
        return docs

    def _read_files(self, files: list[tuple[str, Path]]) -> list[CodeDocument]:
        # Pick files by a hash of their path (not alphabetically), so a small sample spans the whole tree.
        salt = f"select{self.hparams.seed}"
        docs, skipped = read_source_documents(files, lambda key: unit_hash(key, salt),
                                              self.hparams.max_files, self.hparams.max_bytes)
        self.skipped_files = skipped
        if skipped:
            shown = ", ".join(skipped[:_MAX_NAMED_IN_WARNING])
            more = f" and {len(skipped) - _MAX_NAMED_IN_WARNING} more" if len(skipped) > _MAX_NAMED_IN_WARNING else ""
            warnings.warn(f"skipped {len(skipped)} unreadable source file(s): {shown}{more}", stacklevel=3)
        return docs


def _check_arguments(block_size: int, batch_size: int, val_fraction: float, test_fraction: float,
                     max_files: int | None, max_bytes: int | None, mlm_probability: float) -> None:
    """Raise a ValueError for out-of-range sizes, fractions, limits or masking probability."""
    if block_size < 8:
        raise ValueError(f"block_size must be >= 8, got {block_size}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_split_fractions(val_fraction, test_fraction)
    for name, value in (("max_files", max_files), ("max_bytes", max_bytes)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be None or >= 1, got {value}")
    if not 0 < mlm_probability < 1:
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
