"""Click logs written out in Criteo's own text format, to have real-format files without downloading.

One line per row, 40 tab-separated fields: the 0/1 label, the 13 raw counts as integers, and
the 26 categorical ids as 8 hex digits, as in Kaggle's ``train.txt`` and the 1TB logs' ``day_N``::

    1	3	0	12	...	68fd1e64	80e26c9b	...

Synthetic logs keep their counts as ``log1p(count)``; the writer turns them back into the exact
integers. Ids are written through a fixed bijection of 32-bit numbers per table (``hashed_ids``),
so they look like Criteo's hashes and two different ids never share a string; with
``hashed_ids=False`` an id is written as itself in hex (``0000001f``), so that a converter
hashing into at least as many buckets as the table has ids gives back the very same ids.

Taught in chapter 01 (a small file in Criteo's format, converted with ``from-criteo``).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from course_utils.workload.data.logs import ClickLogs

__all__ = ["write_criteo_tsv", "criteo_hex_ids"]

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_ROWS_PER_WRITE = 1 << 16


def _mix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 (different inputs, different outputs)."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
    return x


def criteo_hex_ids(ids: np.ndarray, table: int, hashed: bool = True) -> np.ndarray:
    """Ids ``[N]`` (each below 2**32) of table ``table`` as Criteo-style strings: ``[N]`` ``S8``,
    8 lowercase hex digits. ``hashed``: through a bijection that differs per table."""
    values = ids.astype(np.uint64).astype(np.uint32)
    if hashed:
        values = _mix32(values ^ _mix32(np.full(len(values), table + 1, np.uint32)))
    shifts = np.arange(28, -1, -4, dtype=np.uint32)  # most significant digit first
    digits = _HEX_DIGITS[(values[:, None] >> shifts) & np.uint32(0xF)]  # [N, 8] ASCII
    return np.ascontiguousarray(digits).view("S8").ravel()


def _lines(logs: ClickLogs, hashed_ids: bool) -> bytes:
    """The rows of ``logs`` as Criteo lines, each ending with a newline."""
    import pyarrow as pa
    import pyarrow.compute as pc

    counts = np.rint(np.expm1(logs.dense.astype(np.float64))).astype(np.int64)  # [N, 13] raw counts
    fields = [pc.cast(pa.array(logs.label.astype(np.int64)), pa.string())]
    fields += [pc.cast(pa.array(counts[:, j]), pa.string()) for j in range(counts.shape[1])]
    fields += [
        pa.array(criteo_hex_ids(logs.sparse[:, t], t, hashed_ids), pa.binary()).cast(pa.string())
        for t in range(logs.n_sparse)
    ]
    lines = pc.binary_join_element_wise(
        pc.binary_join_element_wise(*fields, "\t"), pa.array(["\n"] * len(logs)), ""
    )
    offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset : lines.offset + len(lines) + 1]
    return lines.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]]


def write_criteo_tsv(logs: ClickLogs, path: str | Path, *, hashed_ids: bool = True) -> Path:
    """Write ``logs`` (13 dense, 26 sparse columns, as Criteo has) to ``path`` in Criteo's TSV
    format; gzipped when the name ends in ``.gz``. Labels must be 0/1 and dense values
    ``log1p`` of whole counts (as :func:`make_click_logs` makes them). Returns the path."""
    if logs.n_dense != 13 or logs.n_sparse != 26:
        raise ValueError(
            f"Criteo's format has 13 integer and 26 categorical columns; these logs have "
            f"{logs.n_dense} and {logs.n_sparse}."
        )
    if len(logs) and not np.isin(logs.label, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1 to be written in Criteo's format.")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=6) if path.suffix == ".gz" else open(path, "wb") as f:
        for start in range(0, len(logs), _ROWS_PER_WRITE):
            f.write(_lines(logs[start : start + _ROWS_PER_WRITE], hashed_ids))
    return path
