"""Vectorised Criteo parser: a block of whole TSV lines (bytes) to label, dense and id arrays in numpy.

Every field is located from the positions of the tabs and newlines, and the integer and hex columns
are decoded as digit matrices, so no Python code runs per line. Only the common, clean case is
handled: exactly 40 columns per line, ``\\n`` line ends, integers of at most 15 digits (exact in
float64) and hex ids of at most 16 digits (exact in uint64). Anything else (a blank line, a CRLF
file, a longer field, a malformed value) makes `parse_block` return ``None``, and the caller parses
that block line by line with `parse_criteo_line`, which handles the rare cases and names the file
and line of a bad one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE
_MAX_DENSE_DIGITS = 15
_MAX_HEX_DIGITS = 16
_NEWLINE, _MINUS, _ZERO = 10, 45, 48

_HEX_VALUE = np.full(256, 255, dtype=np.uint8)
for _digit, _char in enumerate("0123456789abcdef"):
    _HEX_VALUE[ord(_char)] = _digit
    _HEX_VALUE[ord(_char.upper())] = _digit


@dataclass
class ParsedBlock:
    """Model-ready rows: labels (n,) float32, ``log1p(max(x, 0))`` dense (n, 13) float32, ids (n, 26) int64.

    An id is the hex value modulo its table's size; an empty id is 0.
    """

    labels: np.ndarray
    dense: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def slice(self, begin: int, end: int) -> ParsedBlock:
        """Rows ``begin`` to ``end`` (views, not copies)."""
        return ParsedBlock(self.labels[begin:end], self.dense[begin:end], self.ids[begin:end])


def parse_block(block: bytes, table_sizes: np.ndarray) -> ParsedBlock | None:
    """Parse whole ``\\n``-terminated Criteo lines, or return ``None`` if the block needs the per-line parser.

    ``table_sizes`` holds the 26 table sizes (uint64).
    """
    buf = np.frombuffer(block, dtype=np.uint8)
    if buf.size == 0 or buf[-1] != _NEWLINE:
        return None
    separators = np.flatnonzero(buf <= _NEWLINE)  # tabs, newlines and stray control bytes (refused below)
    if separators.size % NUM_COLUMNS:
        return None
    separators = separators.reshape(-1, NUM_COLUMNS)
    if (buf[separators[:, -1]] != _NEWLINE).any() or (buf[separators[:, :-1]] != 9).any():
        return None
    starts = np.empty_like(separators)
    starts[:, 1:] = separators[:, :-1] + 1
    starts[0, 0] = 0
    starts[1:, 0] = separators[:-1, -1] + 1
    lengths = separators - starts
    labels = _labels(buf, starts[:, 0], lengths[:, 0])
    dense = _decimal_columns(buf, starts[:, 1 : 1 + NUM_DENSE], lengths[:, 1 : 1 + NUM_DENSE])
    hashes = _hex_columns(buf, starts[:, 1 + NUM_DENSE :], lengths[:, 1 + NUM_DENSE :])
    if labels is None or dense is None or hashes is None:
        return None
    ids = np.where(lengths[:, 1 + NUM_DENSE :] == 0, 0, hashes % table_sizes).astype(np.int64)
    return ParsedBlock(labels.astype(np.float32), log1p_dense(dense), ids)


def log1p_dense(values: np.ndarray) -> np.ndarray:
    """Criteo's dense transform: ``log(1 + max(x, 0))`` in float64, returned as float32."""
    return np.log1p(np.maximum(values, 0.0)).astype(np.float32)


def _labels(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """The 0/1 labels, or ``None`` if any label is not a single 0 or 1."""
    if (lengths != 1).any():
        return None
    digits = buf[starts].astype(np.int64) - _ZERO
    return digits if ((digits == 0) | (digits == 1)).all() else None


def _digit_matrix(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes of every field right-aligned in ``width`` columns (padding masked out), and the mask.

    One gather of ``width``-byte windows ending at each field's end (the buffer is left-padded so
    a window never starts before it).
    """
    padded = np.concatenate([np.zeros(width, dtype=np.uint8), buf])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    chars = windows[starts + lengths]  # window k of `padded` ends just before buf[k]
    mask = np.arange(width) >= width - lengths[..., None]
    return chars, mask


def _decimal_columns(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Signed decimal integers as float64 (empty → 0), or ``None`` for a non-integer or over-long field."""
    if lengths.size == 0 or lengths.max() > _MAX_DENSE_DIGITS + 1:
        return None
    negative = (lengths > 0) & (buf[starts] == _MINUS)
    digit_lengths = lengths - negative
    if (negative & (digit_lengths == 0)).any() or digit_lengths.max() > _MAX_DENSE_DIGITS:
        return None
    width = max(int(digit_lengths.max()), 1)
    chars, mask = _digit_matrix(buf, starts + negative, digit_lengths, width)
    digits = np.where(mask, chars, _ZERO) - np.uint8(_ZERO)  # wraps around for bytes below '0'
    if (digits > 9).any():
        return None
    values = np.zeros(digits.shape[:-1], dtype=np.int64)
    for column in range(width):  # Horner's rule: small temporaries, exact (at most 15 digits)
        values = values * 10 + digits[..., column]
    return np.where(negative, -values, values).astype(np.float64)


def _hex_columns(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Hex ids as uint64 (empty → 0), or ``None`` for a non-hex or over-long field."""
    if lengths.size == 0 or lengths.max() > _MAX_HEX_DIGITS:
        return None
    width = 8 if lengths.max() <= 8 else 16
    chars, mask = _digit_matrix(buf, starts, lengths, width)
    nibbles = _HEX_VALUE[np.where(mask, chars, _ZERO)]
    if (nibbles == 255).any():
        return None
    packed = np.ascontiguousarray((nibbles[..., 0::2] << 4) | nibbles[..., 1::2])  # two hex digits per byte
    big_endian = ">u4" if width == 8 else ">u8"
    return packed.view(big_endian)[..., 0].astype(np.uint64)
