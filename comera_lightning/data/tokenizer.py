"""Train-once-and-cache helpers for the WordPiece and byte-level BPE tokenizers the data modules use.

A tokenizer is trained with the Hugging Face `tokenizers` library on the training split and
saved as a `tokenizer.json` in a cache directory. The file name holds the tokenizer kind, the
vocabulary size and a fingerprint of the corpus, so changing either retrains, and a second run
on the same corpus loads the file in milliseconds. A user's own `tokenizer.json` skips all of it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

log = logging.getLogger(__name__)

CACHE_ENV_VAR = "COMERA_CACHE_DIR"
# Bump when the way a tokenizer is built changes, so stale cache files are not reused.
_FORMAT_VERSION = 1

WORDPIECE_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BPE_SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")

TextsFactory = Callable[[], Iterable[str]]


def default_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the cache directory: the argument, else `$COMERA_CACHE_DIR`, else `~/.cache/comera_lightning`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "comera_lightning"


def fingerprint_texts(texts: Iterable[str]) -> str:
    """Return a short content hash of a stream of texts (order and boundaries included)."""
    digest = hashlib.blake2b(digest_size=10)
    count = 0
    for text in texts:
        digest.update(text.encode("utf-8", errors="surrogatepass"))
        digest.update(b"\x00")  # keeps ["ab", "c"] and ["a", "bc"] apart
        count += 1
    digest.update(str(count).encode())
    return digest.hexdigest()


def fingerprint_files(paths: Iterable[str | os.PathLike[str]]) -> str:
    """Return a short hash of file paths, sizes and modification times (no file is read)."""
    digest = hashlib.blake2b(digest_size=10)
    for path in paths:
        stat = os.stat(path)
        digest.update(f"{os.fspath(path)}\x00{stat.st_size}\x00{stat.st_mtime_ns}\x00".encode())
    return digest.hexdigest()


def load_tokenizer_file(path: str | os.PathLike[str], required_tokens: Sequence[str] = ()) -> Tokenizer:
    """Load a user-supplied `tokenizer.json`, checking that it knows the special tokens a data module needs."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"tokenizer file {str(file)!r} does not exist; pass the path of a `tokenizer.json`")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust side raises a plain Exception with a parse message
        raise ValueError(f"could not load tokenizer file {str(file)!r}: {err}") from err
    missing = [tok for tok in required_tokens if tokenizer.token_to_id(tok) is None]
    if missing:
        raise ValueError(
            f"tokenizer file {str(file)!r} lacks the special tokens {missing}; "
            f"this data module needs {list(required_tokens)}"
        )
    return tokenizer


def load_or_train_wordpiece(
    texts_iter_factory: TextsFactory,
    *,
    vocab_size: int,
    cache_path: str | os.PathLike[str] | None = None,
    tokenizer_file: str | os.PathLike[str] | None = None,
    fingerprint: str | None = None,
    min_frequency: int = 2,
) -> Tokenizer:
    """Return a BERT-style lower-casing WordPiece tokenizer, trained on the texts once and then loaded from cache.

    Args:
        texts_iter_factory: called with no argument, returns a fresh iterable over the training texts
            (called once to fingerprint the corpus unless `fingerprint` is given, and once more to train).
        vocab_size: target vocabulary size, special tokens included.
        cache_path: cache directory (default `$COMERA_CACHE_DIR` or `~/.cache/comera_lightning`).
        tokenizer_file: a user's `tokenizer.json`; loaded as is, nothing is trained or cached.
        fingerprint: a corpus identity computed by the caller; default a hash of all texts.
        min_frequency: minimum count of a merge for it to enter the vocabulary.

    The special tokens are `[PAD]`=0, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`; encoding a pair gives
    `[CLS] A [SEP] B [SEP]` with `token_type_ids` 0 for the first segment and 1 for the second.
    """
    if tokenizer_file is not None:
        return load_tokenizer_file(tokenizer_file, WORDPIECE_SPECIAL_TOKENS)
    return _load_or_train("wordpiece", _build_wordpiece, texts_iter_factory, vocab_size, cache_path, fingerprint,
                          min_frequency, min_vocab=len(WORDPIECE_SPECIAL_TOKENS) + 16)


def load_or_train_bytelevel_bpe(
    texts_iter_factory: TextsFactory,
    *,
    vocab_size: int,
    cache_path: str | os.PathLike[str] | None = None,
    tokenizer_file: str | os.PathLike[str] | None = None,
    fingerprint: str | None = None,
    min_frequency: int = 2,
) -> Tokenizer:
    """Return a RoBERTa-style byte-level BPE tokenizer, trained on the texts once and then loaded from cache.

    Arguments as in `load_or_train_wordpiece`. The special tokens are `<s>`=0, `<pad>`=1, `</s>`=2,
    `<unk>`=3, `<mask>`=4; encoding with special tokens gives `<s> A </s>` (pairs `<s> A </s></s> B </s>`).
    Case and whitespace are kept, which is what source code needs.
    """
    if tokenizer_file is not None:
        return load_tokenizer_file(tokenizer_file, BPE_SPECIAL_TOKENS)
    # The 256 byte symbols are always in the vocabulary.
    return _load_or_train("bytelevel-bpe", _build_bytelevel_bpe, texts_iter_factory, vocab_size, cache_path,
                          fingerprint, min_frequency, min_vocab=256 + len(BPE_SPECIAL_TOKENS))


def cached_tokenizer_path(kind: str, vocab_size: int, fingerprint: str,
                          cache_path: str | os.PathLike[str] | None = None) -> Path:
    """Return where the cache keeps the tokenizer of this kind, vocabulary size and corpus fingerprint."""
    name = f"{kind}-v{_FORMAT_VERSION}-vocab{vocab_size}-{fingerprint}.json"
    return default_cache_dir(cache_path) / "tokenizers" / name


def _load_or_train(
    kind: str,
    build: Callable[[TextsFactory, int, int], Tokenizer],
    texts_iter_factory: TextsFactory,
    vocab_size: int,
    cache_path: str | os.PathLike[str] | None,
    fingerprint: str | None,
    min_frequency: int,
    min_vocab: int,
) -> Tokenizer:
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < min_vocab:
        raise ValueError(f"vocab_size for a {kind} tokenizer must be an integer >= {min_vocab}, got {vocab_size!r}")
    if fingerprint is None:
        fingerprint = fingerprint_texts(texts_iter_factory())
    file = cached_tokenizer_path(kind, vocab_size, fingerprint, cache_path)
    if file.is_file():
        try:
            tokenizer = Tokenizer.from_file(str(file))
            log.info("loaded cached %s tokenizer from %s", kind, file)
            return tokenizer
        except Exception:  # a truncated or corrupted cache file: train again and overwrite it
            log.warning("cached tokenizer %s is unreadable; training a new one", file)
    start = time.perf_counter()
    tokenizer = build(texts_iter_factory, vocab_size, min_frequency)
    elapsed = time.perf_counter() - start
    log.info("trained %s tokenizer (vocab %d) in %.1f s; cached at %s", kind, tokenizer.get_vocab_size(), elapsed,
             file)
    _save_atomically(tokenizer, file)
    return tokenizer


def _save_atomically(tokenizer: Tokenizer, file: Path) -> None:
    # Write then rename, so a concurrent reader (another DDP rank) never sees a half-written file.
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, file)


def _build_wordpiece(texts_iter_factory: TextsFactory, vocab_size: int, min_frequency: int) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=None, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(WORDPIECE_SPECIAL_TOKENS),
                                        continuing_subword_prefix="##", show_progress=False)
    tokenizer.train_from_iterator(texts_iter_factory(), trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tokenizer


def _build_bytelevel_bpe(texts_iter_factory: TextsFactory, vocab_size: int, min_frequency: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(BPE_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts_iter_factory(), trainer=trainer)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")), trim_offsets=False,
    )
    return tokenizer
