"""Raw ids into table rows: the hashing trick, what it collides, and the unhashed vocabulary.

A table has a fixed number of rows; the raw ids of a column (``workload.data.raw_ids``: 63-bit
numbers from a space far larger than any table) do not fit it. The hashing trick gives every raw id
the row ``hash(id) mod buckets``: no vocabulary to build or store, any id has a row, and two ids
that land on one row share its embedding (a *collision*): the row learns a blend of both, and each
reads the other's vector. :func:`collision_rate` measures how much of the traffic that touches.

The reference without collisions is a vocabulary (:class:`Vocabulary`): every distinct id seen in
training gets its own row (ids never seen share one row). It needs a row per id ever seen and a map
from id to row, which is what a hashed table avoids and what a managed-collision remapper bounds
(``managed_collisions.py``).

Taught in chapter 07 (appendix 07e, ids that collide).
"""

from __future__ import annotations

import numpy as np

from course_utils.runtime.checks import check_whole

__all__ = ["hash_ids", "collision_rate", "Vocabulary"]

_MASK63 = np.uint64((1 << 63) - 1)
_MULTIPLIERS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # splitmix64 (Steele et al.)


def hash_ids(raw: np.ndarray, buckets: int) -> np.ndarray:
    """Rows ``hash(raw) mod buckets`` (same shape as ``raw``, int64 in ``[0, buckets)``).

    raw: int64 ids ``[...]`` of any size (non-negative, as in TorchRec's ``input_hash_size``).
    The hash mixes all 64 bits before the modulo, so ids that differ only in their high bits do not
    all share a row.
    """
    check_whole("buckets", buckets)
    x = np.asarray(raw).astype(np.uint64)
    with np.errstate(over="ignore"):  # splitmix64's finaliser: every input bit moves every output bit
        x = x ^ (x >> np.uint64(30))
        x = x * _MULTIPLIERS[0]
        x ^= x >> np.uint64(27)
        x = x * _MULTIPLIERS[1]
        x ^= x >> np.uint64(31)
    return ((x & _MASK63) % np.uint64(buckets)).astype(np.int64)


def collision_rate(train_ids: np.ndarray, test_ids: np.ndarray, rows_of) -> float:
    """Share of the lookups ``test_ids [M]`` whose row also holds a *different* id of ``train_ids [N]``.

    rows_of: the mapping from raw ids to rows (``lambda ids: hash_ids(ids, 1024)``, a
    ``Vocabulary``, a remapper's ``remap``). A lookup that collides reads (and in training, writes)
    a row another id trains too.
    """
    seen = np.unique(np.asarray(train_ids).reshape(-1))
    test = np.asarray(test_ids).reshape(-1)
    if test.size == 0:
        raise ValueError("collision_rate needs at least one test id.")
    seen_rows = np.asarray(rows_of(seen))
    rows = np.asarray(rows_of(test))
    size = int(max(seen_rows.max(initial=0), rows.max(initial=0))) + 1
    distinct_per_row = np.bincount(seen_rows, minlength=size)
    # a seen id collides when its row holds another seen id; an unseen id when its row holds any
    others = distinct_per_row[rows] - np.isin(test, seen)
    return float(np.mean(others > 0))


class Vocabulary:
    """Every distinct raw id of ``train_ids`` its own row ``1 ..`` ; row 0 for ids never seen.

    The collision-free reference: ``rows`` grows with the ids seen (``len(vocab)`` rows), and the
    map costs ``map_bytes`` (the sorted ids, 8 bytes each).
    """

    def __init__(self, train_ids: np.ndarray):
        self.ids = np.unique(np.asarray(train_ids).reshape(-1))  # sorted, int64

    def __len__(self) -> int:
        return self.ids.size + 1

    @property
    def map_bytes(self) -> int:
        return int(self.ids.nbytes)

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        """Rows (same shape as ``raw``): ``1 + position`` of a known id, 0 for an unknown one."""
        raw = np.asarray(raw)
        at = np.searchsorted(self.ids, raw)
        at_clipped = np.minimum(at, max(self.ids.size - 1, 0))
        known = (
            (at < self.ids.size) & (self.ids[at_clipped] == raw)
            if self.ids.size
            else np.zeros(raw.shape, bool)
        )
        return np.where(known, at_clipped + 1, 0).astype(np.int64)
