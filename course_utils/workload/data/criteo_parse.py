"""Criteo lines, as Arrow parsed them, turned into model-ready columns, and the bad ones named.

Arrow's CSV reader (``criteo_read.py``) hands over a block of lines as 40 binary columns, one per
field, an empty field as null. :func:`parse_block` checks every field and preprocesses as the
two references do:

* **facebookresearch/dlrm**, ``data_utils.py`` (``getCriteoAdData`` reads each line, turning an
  empty field into ``"0"``; ``processCriteoAdData`` sets negative integers to 0;
  ``transformCriteoAdData`` takes ``log(x + 1)``; with ``--max-ind-range`` a categorical is
  ``int(hex, 16) % max_ind_range``);
* **pytorch/torchrec**, ``torchrec/datasets/criteo.py`` (``BinaryCriteoUtils.tsv_to_npys``: a
  missing value becomes 0, a categorical ``int(hex, 16)``, taken modulo the table size
  (``hashes``) when batches are made; its dense transform is ``log(x + 3)`` without clipping,
  which this course does not follow).

So, per line::

    label     "0" or "1"                                 -> 0.0 or 1.0
    I1..I13   "" -> 0;  x < 0 -> 0;  log1p(x)            -> float32
    C1..C26   "" -> 0;  int(hex, 16) % buckets[t]        -> int32 id in [0, buckets[t])

A missing categorical shares row 0 with the ids that hash to 0, as in both references.
The references keep a full id dictionary (DLRM without ``--max-ind-range``) or a frequency
threshold (TorchRec's ``sparse_to_contiguous``), which needs a first pass over every file and a
dictionary of every distinct id: tens of millions per column on the 1TB logs, far beyond the
1 GB this converter stays in. Hashing needs no pass and no memory: that is the choice here.

A line is **bad** (and never written) for the first of these, in this order:
``utf8`` (bytes that are not UTF-8), ``fields`` (not 40 fields; found by the reader), ``label``
(not exactly ``0`` or ``1``), ``integer`` (an integer field that is not ``-?[0-9]+`` within
int64), ``id`` (a categorical that is not 1 to 16 hex digits).

Taught in chapter 01 (real files, converted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["N_FIELDS", "BAD_KINDS", "BAD_KIND_TEXT", "NOT_UTF8_LABEL", "ParsedBlock", "parse_block"]

N_DENSE, N_SPARSE = 13, 26
N_FIELDS = 1 + N_DENSE + N_SPARSE
#: Kinds of bad lines, in the order a line is judged.
BAD_KINDS = ("utf8", "fields", "label", "integer", "id")
BAD_KIND_TEXT = {
    "utf8": "bytes that are not UTF-8",
    "fields": f"not {N_FIELDS} tab-separated fields",
    "label": "a label that is not 0 or 1",
    "integer": "an integer field that is not a whole number",
    "id": "a categorical id that is not 1-16 hex digits",
}
#: What ``criteo_read`` puts in the label field of a line that was not UTF-8 (itself not UTF-8,
#: so it cannot come from a valid line).
NOT_UTF8_LABEL = b"\xff"

_NIBBLE = np.full(256, 16, np.uint8)  # ASCII byte -> its hex value, 16 if not a hex digit
for _c, _v in zip(b"0123456789abcdef", range(16), strict=True):
    _NIBBLE[_c] = _v
    _NIBBLE[ord(chr(_c).upper())] = _v
_NIBBLE_TABLE = _NIBBLE.tobytes()  # for bytes.translate, which maps bytes faster than indexing
_NOT_HEX = np.uint64(0x1010101010101010)  # bit 4 of each byte: set where a byte was not a hex digit
_PAIRS, _QUADS, _LOW32 = (np.uint64(m) for m in (0x00FF00FF00FF00FF, 0x0000FFFF0000FFFF, 0xFFFFFFFF))


def _pack_nibbles(words: np.ndarray) -> np.ndarray:
    """Eight hex digit values per uint64 (the first digit in the lowest byte, as read from the
    text) -> the 32-bit number they spell, ``[n]`` uint64: pairs, then quads, then all eight."""
    four, eight, sixteen, thirty_two = (np.uint64(k) for k in (4, 8, 16, 32))
    words = ((words << four) | (words >> eight)) & _PAIRS
    words = ((words << eight) | (words >> sixteen)) & _QUADS
    return ((words << sixteen) | (words >> thirty_two)) & _LOW32


@dataclass
class ParsedBlock:
    """The good lines of a block, preprocessed, and where the bad ones were.

    label ``[n] float32``, dense ``[13, n] float32``, sparse ``[26, n] int32``: the good lines,
    column by column (as parquet stores them);
    bad_rows ``[m] int64``: positions in the block of the bad lines, ascending; bad_kinds ``[m]``:
    each one's kind, an index into ``BAD_KINDS``; bad_fields ``[m]``: the field (0 = label,
    1-13 = I1..I13, 14-39 = C1..C26) that made it bad.
    """

    label: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    bad_rows: np.ndarray
    bad_kinds: np.ndarray
    bad_fields: np.ndarray


def _buffers(arr):
    """``(lengths [n] int64, offsets [n + 1] int64, data uint8)`` of an Arrow binary array."""
    offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    offsets = offsets.astype(np.int64)
    return np.diff(offsets), offsets, data


def _labels(arr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(label [n] float32, ok [n] bool, not_utf8 [n] bool)`` of the label column."""
    lengths, offsets, data = _buffers(arr)
    first = (
        data[np.minimum(offsets[:-1], max(len(data) - 1, 0))] if len(data) else np.zeros(len(arr), np.uint8)
    )
    one_byte = lengths == 1
    ok = one_byte & ((first == ord("0")) | (first == ord("1")))
    return (first == ord("1")).astype(np.float32), ok, one_byte & (first == NOT_UTF8_LABEL[0])


def _integers(arr) -> tuple[np.ndarray, np.ndarray]:
    """``(values [n] int64 with missing as 0, ok [n] bool)`` of an integer column.

    Arrow casts the whole column at once; only when that fails are the bad fields looked for, by
    halving (a few casts per bad field), so that "whole number" means what Arrow's cast accepts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def bad_positions(part, start: int) -> list[int]:
        try:
            pc.cast(part, pa.int64())
            return []
        except pa.ArrowInvalid:
            if len(part) == 1:
                return [start]
            half = len(part) // 2
            return bad_positions(part.slice(0, half), start) + bad_positions(part.slice(half), start + half)

    ok = np.ones(len(arr), bool)
    try:
        values = pc.cast(arr, pa.int64())
    except pa.ArrowInvalid:
        ok[bad_positions(arr, 0)] = False
        values = pc.cast(pc.if_else(pa.array(ok), arr, pa.scalar(None, arr.type)), pa.int64())
    return values.fill_null(0).to_numpy(zero_copy_only=False), ok


def _hex_ids(arr) -> tuple[np.ndarray, np.ndarray]:
    """``(values [n] uint64 with missing as 0, ok [n] bool)`` of a categorical column of hex ids."""
    lengths, offsets, data = _buffers(arr)
    n = len(lengths)
    values, ok = np.zeros(n, np.uint64), np.ones(n, bool)
    present = lengths > 0
    if arr.null_count:
        present &= np.asarray(arr.is_valid())
    if (lengths[present] == 8).all() and (lengths[~present] == 0).all():  # the usual case: 8 digits
        chars = data[offsets[0] : offsets[-1]].tobytes()
        words = np.frombuffer(chars.translate(_NIBBLE_TABLE), np.uint64)  # [present], 8 nibbles each
        ok[present] = (words & _NOT_HEX) == 0
        values[present] = _pack_nibbles(words)
        return values, ok
    # any other length: left-pad to 16 digits with "0" (1 to 16 digits fit in 64 bits)
    fits = present & (lengths <= 16)
    idx = offsets[:-1, None] + np.arange(16) - (16 - lengths)[:, None]  # [n, 16]
    pad = idx < offsets[:-1, None]
    chars = np.where(pad | ~fits[:, None], ord("0"), data[np.clip(idx, 0, max(len(data) - 1, 0))])
    nibbles = _NIBBLE[chars]
    packed = (nibbles[:, 0::2] << 4) | (nibbles[:, 1::2] & 15)  # [n, 8]
    values[:] = np.where(fits, np.ascontiguousarray(packed).view(">u8").ravel(), 0)
    ok[:] = (nibbles < 16).all(axis=1) & (fits | ~present)
    return values, ok


def parse_block(batch, buckets: np.ndarray) -> ParsedBlock:
    """Check and preprocess one block: ``batch`` has the 40 fields as binary columns (empty =
    null), ``buckets [26]`` the rows of each table. Returns the :class:`ParsedBlock`."""
    n = batch.num_rows
    label, label_ok, not_utf8 = _labels(batch.column(0))
    kinds = np.full(n, len(BAD_KINDS), np.int8)  # len(BAD_KINDS): good so far; a lower kind wins
    fields = np.zeros(n, np.int8)

    def mark(bad: np.ndarray, kind: str, field_index: int) -> None:
        worse = bad & (kinds > BAD_KINDS.index(kind))
        kinds[worse], fields[worse] = BAD_KINDS.index(kind), field_index

    mark(not_utf8, "utf8", 0)
    mark(~label_ok, "label", 0)
    dense = np.empty((N_DENSE, n), np.float32)
    for j in range(N_DENSE):
        values, ok = _integers(batch.column(1 + j))
        mark(~ok, "integer", 1 + j)
        dense[j] = np.log1p(np.maximum(values, 0).astype(np.float64))
    sparse = np.empty((N_SPARSE, n), np.int32)
    for t in range(N_SPARSE):
        values, ok = _hex_ids(batch.column(1 + N_DENSE + t))
        mark(~ok, "id", 1 + N_DENSE + t)
        sparse[t] = values % np.uint64(buckets[t])
    good = kinds == len(BAD_KINDS)
    bad_rows = np.flatnonzero(~good)
    if len(bad_rows):
        label, dense, sparse = label[good], dense[:, good], sparse[:, good]
    return ParsedBlock(label, dense, sparse, bad_rows, kinds[bad_rows], fields[bad_rows])
