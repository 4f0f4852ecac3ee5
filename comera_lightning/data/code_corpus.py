"""Masked-language-model pre-training data from source code (CodeBERT-style).

`CodeCorpusDataModule` reads a code corpus, splits it by file (a hash of each file's relative
path picks train / validation / test, so a file never straddles splits), trains a byte-level BPE
tokenizer on the training files (cached), packs the token stream into fixed blocks of
`block_size` tokens (`<s>` first, `</s>` between documents), and masks tokens on the fly.

Corpora:

* default: the Python standard library on this machine (`sysconfig.get_paths()["stdlib"]`, `*.py`,
  never `site-packages`, test folders excluded unless `exclude_tests=False`);
* `source_dirs` (+ `extensions`): any folders of source files;
* `jsonl_files`: CodeSearchNet-style JSONL (optionally `.gz`), one record per line with a `code`
  or `original_string` field (records with `repo`/`path` are split by that path).

Batches: `input_ids` (long, `[batch, block_size]`), `attention_mask` (bool, True on real tokens) and
`labels` (long; the original token where one was selected for prediction, -100 elsewhere).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import sysconfig
import tokenize
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, RandomSampler

from comera_lightning.data.tokenizer import BPE_SPECIAL_TOKENS, load_or_train_bytelevel_bpe

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
TEST_DIR_NAMES = frozenset({"test", "tests", "idle_test"})
ALWAYS_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
CODE_FIELDS = ("code", "original_string")
_MAX_NAMED_IN_WARNING = 20


@dataclass(frozen=True)
class CodeDocument:
    """One document of the corpus: `key` (a relative path, decides the split) and its text."""

    key: str
    text: str


# --------------------------------------------------------------------------- reading the corpus


def stdlib_dir() -> Path:
    """The directory of this interpreter's Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_source_files(
    roots: Sequence[str | os.PathLike[str]], extensions: Sequence[str], exclude_tests: bool = True
) -> list[tuple[str, Path]]:
    """Return `(relative key, path)` of every file under `roots` with one of `extensions`, sorted by key."""
    exts = tuple(e if e.startswith(".") else f".{e}" for e in extensions)
    found: dict[str, Path] = {}
    for root in map(Path, roots):
        root = root.expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"source directory {str(root)!r} does not exist or is not a directory")
        for dirpath, dirnames, filenames in os.walk(root):
            # Prune in place so os.walk never descends into excluded folders.
            dirnames[:] = sorted(d for d in dirnames if not _excluded_dir(d, exclude_tests))
            for name in filenames:
                if name.endswith(exts):
                    path = Path(dirpath) / name
                    key = path.relative_to(root).as_posix()
                    found.setdefault(key if len(roots) == 1 else f"{root.name}/{key}", path)
    return sorted(found.items())


def _excluded_dir(name: str, exclude_tests: bool) -> bool:
    return name in ALWAYS_EXCLUDED_DIRS or (exclude_tests and name in TEST_DIR_NAMES)


def read_source_file(path: Path) -> str:
    """Decode a source file: UTF-8 (BOM allowed), or a Python file's PEP 263 coding cookie; raises if it cannot."""
    data = path.read_bytes()
    if path.suffix == ".py":
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    return data.decode("utf-8-sig")


def read_code_jsonl(path: str | os.PathLike[str], max_docs: int | None = None) -> list[CodeDocument]:
    """Read CodeSearchNet-style JSONL (plain or `.gz`), one record per line with a `code` or `original_string`."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"JSONL file {str(file)!r} does not exist")
    opener = gzip.open if file.suffix == ".gz" else open
    docs: list[CodeDocument] = []
    with opener(file, "rt", encoding="utf-8") as handle:
        lineno = 0
        try:
            for lineno, line in enumerate(handle, start=1):
                if max_docs is not None and len(docs) >= max_docs:
                    break
                if line.strip():
                    docs.append(_code_record(line, file, lineno))
        except (UnicodeDecodeError, OSError, EOFError) as err:  # bad bytes or a corrupt gzip stream
            raise ValueError(f"{file}: line {lineno + 1}: cannot read ({err}); expected UTF-8 JSONL") from err
    return docs


def _code_record(line: str, file: Path, lineno: int) -> CodeDocument:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: line {lineno}: invalid JSON ({err.msg} at column {err.colno})") from err
    if not isinstance(record, dict):
        raise ValueError(f"{file}: line {lineno}: expected a JSON object, found {type(record).__name__}")
    code = next((record[k] for k in CODE_FIELDS if isinstance(record.get(k), str)), None)
    if code is None:
        raise ValueError(f"{file}: line {lineno}: no string field `code` or `original_string` "
                         f"(keys: {', '.join(sorted(record)[:10])})")
    # Functions of one source file share its path, so they land in the same split.
    if isinstance(record.get("path"), str):
        key = f"{record.get('repo', '')}/{record['path']}"
    else:
        key = f"{file.name}:{lineno}"
    return CodeDocument(key, code)


def _unit_hash(key: str, salt: str) -> float:
    """A deterministic number in [0, 1) for a key (stable across runs and machines, unlike `hash`)."""
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_of(key: str, val_fraction: float, test_fraction: float, seed: int = 0) -> str:
    """The split ('train', 'validation' or 'test') a document key belongs to."""
    u = _unit_hash(key, f"split{seed}")
    if u < val_fraction:
        return "validation"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def split_documents(
    docs: Sequence[CodeDocument], val_fraction: float, test_fraction: float, seed: int = 0
) -> dict[str, list[CodeDocument]]:
    """Split documents by the hash of their keys; a split left empty borrows one training document."""
    parts: dict[str, list[CodeDocument]] = {name: [] for name in SPLITS}
    for doc in docs:
        parts[split_of(doc.key, val_fraction, test_fraction, seed)].append(doc)
    # Tiny corpora (max_files=10) could leave validation or test empty; give each one document.
    for name, fraction in (("validation", val_fraction), ("test", test_fraction)):
        if fraction > 0 and not parts[name] and len(parts["train"]) > 1:
            parts[name].append(parts["train"].pop())
    return parts


# --------------------------------------------------------------------------- packing and masking


def pack_blocks(
    token_lists: Sequence[Sequence[int]], block_size: int, *, bos_id: int, sep_id: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pack documents into `[num_blocks, block_size]` ids: `<s>` then `block_size - 1` tokens of the stream
    `doc1 </s> doc2 </s> ...`; the last block is padded. Returns the blocks and each block's real length.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    pieces = []
    for ids in token_lists:
        pieces.append(np.asarray(ids, dtype=np.int32))
        pieces.append(np.asarray([sep_id], dtype=np.int32))
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    body = block_size - 1
    n_blocks = -(-len(stream) // body)  # ceil
    blocks = np.full((n_blocks, block_size), pad_id, dtype=np.int32)
    blocks[:, 0] = bos_id
    padded = np.full(n_blocks * body, pad_id, dtype=np.int32)
    padded[: len(stream)] = stream
    blocks[:, 1:] = padded.reshape(n_blocks, body)
    lengths = np.full(n_blocks, block_size, dtype=np.int64)
    if n_blocks:
        lengths[-1] = 1 + len(stream) - (n_blocks - 1) * body
    return blocks, lengths


class PackedBlocks(Dataset):
    """Fixed-length token blocks; `labels` is set for evaluation splits, whose masks are drawn once."""

    def __init__(self, blocks: np.ndarray, lengths: np.ndarray, labels: torch.Tensor | None = None,
                 masked_ids: torch.Tensor | None = None) -> None:
        self.blocks = torch.from_numpy(blocks)
        positions = torch.arange(blocks.shape[1])
        self.attention_mask = positions[None, :] < torch.from_numpy(lengths)[:, None]
        self.labels = labels
        self.masked_ids = masked_ids

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.masked_ids is not None and self.labels is not None:
            return {"input_ids": self.masked_ids[index], "attention_mask": self.attention_mask[index],
                    "labels": self.labels[index]}
        return {"input_ids": self.blocks[index].long(), "attention_mask": self.attention_mask[index]}


class MLMCollator:
    """Stack blocks and apply dynamic BERT masking: select `mlm_probability` of the non-special tokens; of
    those, 80% become `<mask>`, 10% a random non-special token and 10% stay; labels are -100 elsewhere.
    """

    def __init__(
        self,
        mask_token_id: int,
        vocab_size: int,
        special_token_ids: Sequence[int],
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> None:
        if not 0 < mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if mask_replace_prob < 0 or random_replace_prob < 0 or mask_replace_prob + random_replace_prob > 1:
            raise ValueError("mask_replace_prob and random_replace_prob must be >= 0 with a sum <= 1, got "
                             f"{mask_replace_prob} and {random_replace_prob}")
        self.mask_token_id = mask_token_id
        self.mlm_probability = mlm_probability
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.generator = generator
        self.special_token_ids = torch.tensor(sorted(set(special_token_ids)), dtype=torch.long)
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[self.special_token_ids[self.special_token_ids < vocab_size]] = False
        self.random_candidates = allowed.nonzero().flatten()

    def __call__(self, items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Stack `input_ids`/`attention_mask` and mask them (items that carry `labels` are stacked as they are)."""
        input_ids = torch.stack([item["input_ids"] for item in items]).long()
        attention_mask = torch.stack([item["attention_mask"] for item in items])
        if "labels" in items[0]:
            labels = torch.stack([item["labels"] for item in items])
            return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        input_ids, labels = self.mask(input_ids, attention_mask)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return masked ids and labels for a `[batch, length]` id tensor (the input is not modified)."""
        gen = generator if generator is not None else self.generator
        input_ids = input_ids.clone()
        maskable = attention_mask.bool() & ~torch.isin(input_ids, self.special_token_ids)
        selected = (torch.rand(input_ids.shape, generator=gen) < self.mlm_probability) & maskable
        labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
        # One uniform draw per token picks <mask> / random / unchanged with the configured ratios.
        choice = torch.rand(input_ids.shape, generator=gen)
        to_mask = selected & (choice < self.mask_replace_prob)
        to_random = selected & ~to_mask & (choice < self.mask_replace_prob + self.random_replace_prob)
        input_ids[to_mask] = self.mask_token_id
        n_random = int(to_random.sum())
        if n_random:
            picks = torch.randint(len(self.random_candidates), (n_random,), generator=gen)
            input_ids[to_random] = self.random_candidates[picks]
        return input_ids, labels


# --------------------------------------------------------------------------- the data module


class CodeCorpusDataModule(pl.LightningDataModule):
    """Masked-LM batches from a code corpus (the local Python stdlib by default) with a cached byte-level BPE.

    Args:
        source_dirs: folders of source files to read instead of the standard library.
        extensions: file name endings to read from `source_dirs` (and the stdlib).
        jsonl_files: CodeSearchNet-style JSONL files (`.jsonl` or `.jsonl.gz`) with a `code` or
            `original_string` field; combined with `source_dirs` when both are given.
        exclude_tests: skip folders named `test`, `tests` or `idle_test`.
        block_size: tokens per packed block, `<s>` included.
        batch_size: training batch size.
        eval_batch_size: validation/test batch size (default: `batch_size`).
        mlm_probability: fraction of non-special tokens selected for prediction.
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
    """

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
    ) -> None:
        super().__init__()
        if block_size < 8:
            raise ValueError(f"block_size must be >= 8, got {block_size}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(f"val_fraction and test_fraction must be in [0, 1) with a sum below 1, "
                             f"got {val_fraction} and {test_fraction}")
        for name, value in (("max_files", max_files), ("max_bytes", max_bytes)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be None or >= 1, got {value}")
        if not 0 < mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        self.save_hyperparameters()
        self.source_dirs = list(source_dirs) if source_dirs else None
        self.extensions = list(extensions) if extensions else [".py"]
        self.jsonl_files = list(jsonl_files) if jsonl_files else None
        self.exclude_tests = exclude_tests
        self.block_size = block_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.mlm_probability = mlm_probability
        self.tokenizer_vocab_size = vocab_size
        self.tokenizer_file = tokenizer_file
        self.cache_dir = cache_dir
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.drop_last = drop_last
        self._documents: dict[str, list[CodeDocument]] | None = None
        self._tokenizer: Tokenizer | None = None
        self._datasets: dict[str, PackedBlocks] = {}
        self.skipped_files: list[str] = []

    # ---- metadata

    @property
    def documents(self) -> dict[str, list[CodeDocument]]:
        """The corpus documents of each split (read on first use)."""
        if self._documents is None:
            docs = self._read_corpus()
            if not docs:
                raise ValueError(f"the code corpus is empty ({self._describe_source()}); "
                                 "check source_dirs / extensions / jsonl_files")
            self._documents = split_documents(docs, self.val_fraction, self.test_fraction, self.seed)
            log.info("code corpus (%s): %s documents", self._describe_source(),
                     {k: len(v) for k, v in self._documents.items()})
        return self._documents

    @property
    def tokenizer(self) -> Tokenizer:
        """The byte-level BPE tokenizer (trained on the training files and cached, or the user's file)."""
        if self._tokenizer is None:
            train = self.documents["train"]
            self._tokenizer = load_or_train_bytelevel_bpe(
                lambda: (doc.text for doc in train), vocab_size=self.tokenizer_vocab_size,
                cache_path=self.cache_dir, tokenizer_file=self.tokenizer_file,
            )
            self._tokenizer.no_truncation()
            self._tokenizer.no_padding()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer (the embedding table size a model needs)."""
        return self.tokenizer.get_vocab_size()

    @property
    def pad_token_id(self) -> int:
        """Id of `<pad>`."""
        return self._token_id("<pad>")

    @property
    def mask_token_id(self) -> int:
        """Id of `<mask>`."""
        return self._token_id("<mask>")

    @property
    def special_token_ids(self) -> list[int]:
        """Ids of `<s>`, `<pad>`, `</s>`, `<unk>`, `<mask>` (never selected for masking)."""
        return [self._token_id(tok) for tok in BPE_SPECIAL_TOKENS]

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:  # only reachable with a tokenizer object swapped in by hand
            raise ValueError(f"the tokenizer has no {token!r} token")
        return token_id

    def collator(self, generator: torch.Generator | None = None) -> MLMCollator:
        """The dynamic-masking collate function of this corpus."""
        return MLMCollator(self.mask_token_id, self.vocab_size, self.special_token_ids,
                           mlm_probability=self.mlm_probability, generator=generator)

    # ---- Lightning hooks

    def prepare_data(self) -> None:
        """Read the corpus and train (or load) the cached tokenizer once, on the main process."""
        _ = self.tokenizer

    def setup(self, stage: str | None = None) -> None:
        """Tokenize and pack the splits the stage needs."""
        wanted = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",),
                  "predict": ("test",)}.get(stage or "", SPLITS)
        for name in wanted:
            self.dataset(name)

    def dataset(self, split: str) -> PackedBlocks:
        """The packed blocks of a split (built on first use); evaluation splits carry fixed masks."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split not in self._datasets:
            self._datasets[split] = self._build_dataset(split)
        return self._datasets[split]

    def train_dataloader(self) -> DataLoader:
        """Shuffled training blocks with fresh masks every time a block is drawn."""
        data = self.dataset("train")
        sampler = RandomSampler(data, generator=torch.Generator().manual_seed(self.seed))
        return DataLoader(data, batch_size=self.batch_size, sampler=sampler, drop_last=self.drop_last,
                          collate_fn=self.collator(), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        """Validation blocks with masks drawn once (the same every epoch)."""
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        """Test blocks with masks drawn once."""
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(self.dataset(split), batch_size=self.eval_batch_size, shuffle=False,
                          collate_fn=self.collator(), num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    # ---- building

    def _build_dataset(self, split: str) -> PackedBlocks:
        docs = self.documents[split]
        if not docs:
            raise ValueError(f"the {split} split of the code corpus is empty ({self._describe_source()}); "
                             "use more files or a larger val_fraction/test_fraction")
        encodings = self.tokenizer.encode_batch([doc.text for doc in docs], add_special_tokens=False)
        blocks, lengths = pack_blocks([enc.ids for enc in encodings], self.block_size,
                                      bos_id=self._token_id("<s>"), sep_id=self._token_id("</s>"),
                                      pad_id=self.pad_token_id)
        dataset = PackedBlocks(blocks, lengths)
        if split != "train":
            # Fixed evaluation masks make validation losses comparable across epochs and runs.
            generator = torch.Generator().manual_seed(self.seed + SPLITS.index(split))
            masked, labels = self.collator().mask(dataset.blocks.long(), dataset.attention_mask, generator)
            dataset = PackedBlocks(blocks, lengths, labels=labels, masked_ids=masked)
        log.info("code corpus %s: %d documents -> %d blocks of %d tokens", split, len(docs), len(dataset),
                 self.block_size)
        return dataset

    def _describe_source(self) -> str:
        parts = []
        if self.source_dirs:
            parts.append(f"source_dirs={self.source_dirs} extensions={self.extensions}")
        if self.jsonl_files:
            parts.append(f"jsonl_files={self.jsonl_files}")
        return "; ".join(parts) or f"Python stdlib at {stdlib_dir()}"

    def _read_corpus(self) -> list[CodeDocument]:
        docs: list[CodeDocument] = []
        if self.source_dirs or not self.jsonl_files:
            roots = self.source_dirs or [str(stdlib_dir())]
            docs.extend(self._read_files(list_source_files(roots, self.extensions, self.exclude_tests)))
        for path in self.jsonl_files or []:
            remaining = None if self.max_files is None else self.max_files - len(docs)
            if remaining is not None and remaining <= 0:
                break
            docs.extend(read_code_jsonl(path, remaining))
        return docs

    def _read_files(self, files: list[tuple[str, Path]]) -> list[CodeDocument]:
        # Pick files by a hash of their path (not alphabetically), so a small sample spans the whole tree.
        files = sorted(files, key=lambda kv: _unit_hash(kv[0], f"select{self.seed}"))
        docs: list[CodeDocument] = []
        skipped: list[str] = []
        total = 0
        for key, path in files:
            if self.max_files is not None and len(docs) >= self.max_files:
                break
            try:
                size = path.stat().st_size
                if self.max_bytes is not None and total + size > self.max_bytes:
                    continue
                text = read_source_file(path)
            except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as err:
                skipped.append(f"{path} ({type(err).__name__})")
                continue
            total += size
            docs.append(CodeDocument(key, text))
        self.skipped_files = skipped
        if skipped:
            shown = ", ".join(skipped[:_MAX_NAMED_IN_WARNING])
            more = f" and {len(skipped) - _MAX_NAMED_IN_WARNING} more" if len(skipped) > _MAX_NAMED_IN_WARNING else ""
            warnings.warn(f"skipped {len(skipped)} unreadable source file(s): {shown}{more}", stacklevel=3)
        return docs

