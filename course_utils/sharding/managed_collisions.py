"""A collision-free row for each id that matters: a frequency-managed id map with eviction.

Hashing gives every raw id a row but lets frequent ids share rows with each other. A managed map
gives the ``slots - 1`` ids seen most often a row of their own and sends every other id to one
shared row (the last, ``slots - 1``): the frequent ids, which carry most lookups and most of the
signal, never collide, and the table keeps a fixed size however many raw ids arrive.

It works like TorchRec's ``MCHManagedCollisionModule`` (``torchrec/modules/mc_modules.py``), whose
operators (``torch.unique``, ``searchsorted``, ``argsort``) run on CPU as on GPU:

* ``profile(ids)`` stores each batch's ids in a history buffer; every ``interval`` batches the
  history is counted and merged with the ids held (TorchRec: ``eviction_interval``,
  ``_coalesce_history``);
* the held ids and the newcomers compete by count seen, then by the last window seen (TorchRec's
  ``LFU_EvictionPolicy`` ranks by counts, ``LRU_EvictionPolicy`` by last access,
  ``DistanceLFU_EvictionPolicy`` by counts over distance); the best ``slots - 1`` keep or take a
  row, a held id that loses is *evicted* and its row goes to a newcomer (TorchRec's ``evict()``
  returns such rows so that their embeddings can be reset);
* ``remap(ids)`` finds each id by binary search in the sorted held ids (TorchRec:
  ``searchsorted`` on ``_mch_sorted_raw_ids``); an id not held gets the shared row
  (TorchRec: ``zch_size - 1``, or a hashed residual range with ``mch_size``).

Its memory is the map, not the ids ever seen: four int64 arrays of ``slots - 1`` entries (held ids,
their rows, counts, last window) plus the history buffer of one interval.

Taught in chapter 07 (appendix 07e, ids that collide).
"""

from __future__ import annotations

import numpy as np

from course_utils.runtime.checks import check_whole

__all__ = ["FrequencyRemapper"]


class FrequencyRemapper:
    """Own rows ``0 .. slots - 2`` for the ids seen most often; row ``slots - 1`` for the rest.

    slots: table rows it manages (at least 2). interval: batches between two updates of the map.
    Counters: ``evictions`` (held ids that lost their row), ``admissions`` (ids given a row),
    ``updates`` (windows merged).
    """

    def __init__(self, slots: int, interval: int = 1):
        check_whole("slots", slots, low=2)
        check_whole("interval", interval)
        self.slots, self.interval = int(slots), int(interval)
        self.held = np.empty(0, np.int64)  # sorted raw ids with a row of their own
        self.rows = np.empty(0, np.int64)  # row of each held id
        self.counts = np.empty(0, np.int64)  # times seen since admitted
        self.last = np.empty(0, np.int64)  # last window in which it was seen
        self._free = np.arange(self.slots - 1, dtype=np.int64)  # rows no id holds
        self._history: list[np.ndarray] = []
        self._batches = 0
        self.updates = self.evictions = self.admissions = 0

    @property
    def shared_row(self) -> int:
        return self.slots - 1

    @property
    def map_bytes(self) -> int:
        """Bytes of the id map: held ids, rows, counts and last windows (int64 each)."""
        return int(self.held.nbytes + self.rows.nbytes + self.counts.nbytes + self.last.nbytes)

    @property
    def history_bytes(self) -> int:
        """Bytes of the ids waiting in the history buffer (at most one interval's)."""
        return int(sum(h.nbytes for h in self._history))

    def profile(self, ids: np.ndarray) -> None:
        """Record one batch of raw ids ``[...]`` int64; update the map every ``interval`` batches."""
        self._history.append(np.asarray(ids, dtype=np.int64).reshape(-1))
        self._batches += 1
        if self._batches % self.interval == 0:
            self.flush()

    def flush(self) -> None:
        """Merge the history into the map now (also at the end of a stream)."""
        if not self._history:
            return
        self.updates += 1
        ids, counts = np.unique(np.concatenate(self._history), return_counts=True)
        self._history = []
        where = self._find(ids)
        known = where >= 0
        self.counts[where[known]] += counts[known]
        self.last[where[known]] = self.updates
        self._compete(ids[~known], counts[~known])

    def _find(self, ids: np.ndarray) -> np.ndarray:
        """Position of each id in ``held`` (``-1`` where not held)."""
        if self.held.size == 0:
            return np.full(ids.shape, -1, np.int64)
        at = np.minimum(np.searchsorted(self.held, ids), self.held.size - 1)
        return np.where(self.held[at] == ids, at, -1)

    def _compete(self, new_ids: np.ndarray, new_counts: np.ndarray) -> None:
        """Keep the best ``slots - 1`` of the held ids and the newcomers: count, then recency,
        then held before new (no churn between equals), then the smaller id (a fixed order)."""
        n_held = self.held.size
        ids = np.concatenate([self.held, new_ids])
        counts = np.concatenate([self.counts, new_counts])
        last = np.concatenate([self.last, np.full(new_ids.size, self.updates, np.int64)])
        is_new = np.arange(ids.size) >= n_held
        order = np.lexsort((ids, is_new, -last, -counts))  # the last key sorts first
        keep = np.zeros(ids.size, bool)
        keep[order[: self.slots - 1]] = True
        lost = ~keep[:n_held]
        self.evictions += int(lost.sum())
        self._free = np.concatenate([self.rows[lost], self._free])  # evicted rows are reused first
        admitted = keep[n_held:]
        n_in = int(admitted.sum())
        self.admissions += n_in
        rows = np.concatenate([self.rows[~lost], self._free[:n_in]])
        self._free = self._free[n_in:]
        ids = np.concatenate([self.held[~lost], new_ids[admitted]])
        counts = np.concatenate([self.counts[~lost], new_counts[admitted]])
        last = np.concatenate([self.last[~lost], np.full(n_in, self.updates, np.int64)])
        by_id = np.argsort(ids, kind="stable")
        self.held, self.rows, self.counts, self.last = ids[by_id], rows[by_id], counts[by_id], last[by_id]

    def remap(self, ids: np.ndarray) -> np.ndarray:
        """Rows (same shape as ``ids``): a held id's own row, else the shared row ``slots - 1``."""
        ids = np.asarray(ids, dtype=np.int64)
        where = self._find(ids.reshape(-1))
        rows = np.where(where >= 0, self.rows[np.maximum(where, 0)] if self.rows.size else 0, self.shared_row)
        return rows.reshape(ids.shape).astype(np.int64)

    __call__ = remap
