"""Debezium's `precise` decimals: a column `decimal(p,s)` arrives as base64 text of the unscaled
value (the number times 10^s) in big-endian two's complement, as Kafka Connect's `Decimal`
logical type writes it in JSON. `"AKeY"` is 0x00A798 = 42904, with scale 2 `429.04`.

Decoded for a whole column at once with numpy: values of at most 16 bytes (24 base64
characters) are decimal128's; longer, malformed or out-of-precision values are reported per
row, so the decoder fails those records alone.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SIXBITS = np.full(256, 255, dtype=np.uint8)
_SIXBITS[np.frombuffer(_ALPHABET, dtype=np.uint8)] = np.arange(64, dtype=np.uint8)
_PAD = ord("=")
_WIDTH = 24  # base64 characters of the 16 bytes of a decimal128, padding included
_BYTES = _WIDTH // 4 * 3


def unscaled_decimals(text: pa.Array, dtype: pa.Decimal128Type) -> tuple[pa.Array, np.ndarray]:
    """The decimals `text` encodes, and a mask of the rows whose non-null text is not one of
    `dtype` (those rows are null in the result)."""
    n = len(text)
    present = pc.is_valid(text).to_numpy(zero_copy_only=False)
    lengths = pc.binary_length(pc.fill_null(text, "")).to_numpy(zero_copy_only=False)
    fits = present & (lengths > 0) & (lengths <= _WIDTH) & (lengths % 4 == 0)
    # Every row padded to the same width: one (n, 24) matrix of characters.
    same = pc.if_else(pa.array(fits), pc.fill_null(text, ""), "")
    padded = pc.utf8_rpad(same, width=_WIDTH, padding="=").cast(pa.binary())
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset:][:n + 1]
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8)
    chars = data[offsets[0]:offsets[-1]].reshape(n, _WIDTH)

    # Padding may only end a value: its own (at most two '=') then the row's.
    own_pad = (chars == _PAD).sum(axis=1) - (_WIDTH - lengths)
    position = np.arange(_WIDTH)[None, :]
    content = position < (lengths - own_pad)[:, None]
    sixbits = _SIXBITS[chars]
    fits &= (own_pad <= 2) & ~((sixbits == 255) & content).any(axis=1)
    fits &= ~((chars == _PAD) & content).any(axis=1)

    quads = np.where(content, sixbits, 0).astype(np.uint32).reshape(n, _WIDTH // 4, 4)
    words = (quads[:, :, 0] << 18) | (quads[:, :, 1] << 12) | (quads[:, :, 2] << 6) | quads[:, :, 3]
    big_endian = np.stack([(words >> 16) & 0xFF, (words >> 8) & 0xFF, words & 0xFF],
                          axis=2).reshape(n, _BYTES).astype(np.uint8)
    used = lengths // 4 * 3 - own_pad
    fits &= (used >= 1) & (used <= 16)

    # Right-align each value in 16 bytes, sign-extended, then little-endian as Arrow stores it.
    negative = (big_endian[:, 0] & 0x80) != 0
    source = np.arange(16)[None, :] + (used - 16)[:, None]
    gathered = np.take_along_axis(big_endian, np.clip(source, 0, _BYTES - 1), axis=1)
    extended = np.where(source < 0, np.where(negative, 0xFF, 0)[:, None], gathered)
    little = np.ascontiguousarray(np.where(fits[:, None], extended, 0)[:, ::-1], dtype=np.uint8)

    widest = pa.decimal128(38, dtype.scale)
    validity = pa.array(fits).buffers()[1]
    values = pa.Array.from_buffers(widest, n, [validity, pa.py_buffer(little.tobytes())],
                                   null_count=int(n - fits.sum()))
    if dtype.precision < 38:  # within the column's precision: below 10^(p-s) in magnitude
        bound = pa.scalar(Decimal(10) ** (dtype.precision - dtype.scale), widest)
        inside = pc.fill_null(pc.less(pc.abs(values), bound), False)
        fits &= inside.to_numpy(zero_copy_only=False)
    result = pc.if_else(pa.array(fits), values, pa.scalar(None, widest)).cast(dtype)
    return result, present & ~fits
