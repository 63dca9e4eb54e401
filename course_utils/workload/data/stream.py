"""Mini-batches of a rank's parquet row groups, read as they are needed (taught in chapter 04).

A rank owns row groups ``rank, rank + W, ...``
(:func:`~course_utils.workload.data.parquet.row_groups_of_rank`).
Each epoch it visits them in an order shuffled with ``seed + epoch``, shuffles the rows of
each row group, and cuts the resulting stream of rows into batches::

    rng = Generator(PCG64(seed + epoch))
    for group in its row groups, in the order rng.permutation(...):
        rows = read(group)[rng.permutation(rows in group)]    # the only rows held: one row group
        yield batches of batch_size rows (the last few rows wait for the next group)

So the buffer is one row group plus less than one batch, whatever the file's size: choose
row groups of a few tens of MB. Every rank yields the same number of batches, as many full
ones as the smallest share allows, so that data-parallel ranks step together.

``in_memory=True`` reads the rank's whole share once, keeps it, and yields exactly the same
batches from memory (for small files, or to compare: ``benchmarks/data_loading.py``).

Taught in chapter 04 (batches streamed from row groups).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from torch.utils.data import IterableDataset

from course_utils.runtime.checks import check_whole
from course_utils.workload.data.logs import Batch, ClickLogs
from course_utils.workload.data.parquet import open_parquet, parquet_info, read_row_groups, row_groups_of_rank

__all__ = ["ParquetBatches"]


class ParquetBatches(IterableDataset):
    """Rank ``rank``'s batches of the parquet file ``path``, one epoch per iteration.

    ``len()`` is the number of batches of an epoch; ``set_epoch(epoch)`` picks the epoch's
    order (as ``DistributedSampler.set_epoch`` does); never called, every epoch is epoch 0.
    ``stats`` counts, for the curious and for tests: ``groups_read``, ``rows_read``, ``batches``.
    """

    def __init__(
        self,
        path,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        seed: int = 0,
        in_memory: bool = False,
    ):
        check_whole("batch_size", batch_size)
        self.path, self.batch_size, self.seed, self.in_memory = Path(path), batch_size, seed, in_memory
        info = parquet_info(self.path)
        rows = info["rows_per_group"]
        self.groups = row_groups_of_rank(len(rows), rank, world_size, self.path)
        self.group_rows = [rows[g] for g in self.groups]
        shares = [
            sum(rows[g] for g in row_groups_of_rank(len(rows), r, world_size, self.path))
            for r in range(world_size)
        ]
        self.steps = min(shares) // batch_size
        self.epoch = 0
        self.stats = {"groups_read": 0, "rows_read": 0, "batches": 0}
        self._share = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps

    def _orders(self) -> Iterator[tuple[int, np.ndarray]]:
        """This epoch's ``(position of a row group among this rank's, its row order)``, in visiting order."""
        rng = np.random.Generator(np.random.PCG64(self.seed + self.epoch))
        for i in rng.permutation(len(self.groups)):
            yield int(i), rng.permutation(self.group_rows[i])

    def _read(self, pf, cards, positions: list[int]) -> ClickLogs:
        rows = read_row_groups(pf, [self.groups[i] for i in positions], cards)
        self.stats["groups_read"] += len(positions)
        self.stats["rows_read"] += len(rows)
        return rows

    def _row_stream(self) -> Iterator[ClickLogs]:
        """The epoch's rows, one shuffled row group at a time."""
        if self.in_memory:
            if self._share is None:
                pf, cards = open_parquet(self.path)
                self._share = self._read(pf, cards, list(range(len(self.groups))))
            starts = np.concatenate([[0], np.cumsum(self.group_rows)])
            for i, order in self._orders():
                yield self._share[starts[i] + order]
            return
        pf, cards = open_parquet(self.path)
        for i, order in self._orders():
            yield self._read(pf, cards, [i])[order]

    def __iter__(self) -> Iterator[Batch]:
        made, rest = 0, None
        for rows in self._row_stream():
            rows = rows if rest is None else ClickLogs.concat([rest, rows])
            start = 0
            while len(rows) - start >= self.batch_size and made < self.steps:
                batch = rows[start : start + self.batch_size].to_torch()
                self.stats["batches"] += 1
                made, start = made + 1, start + self.batch_size
                yield batch
            if made == self.steps:
                return
            rest = rows[start:]
