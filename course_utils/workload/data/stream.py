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

A job resumed mid-epoch passes the epoch's history, the layouts that already worked on it
(``set_epoch(epoch, history=[(world_size, rows per rank per batch, batches), ...])``,
``epoch_position``): the rank then streams only its rows that no earlier layout used, and never
reads a row group they used up. With the same number of ranks throughout, that is the
uninterrupted run's next batches exactly.

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
from course_utils.workload.data.epoch_position import Segment, rows_left, used_rows, visiting_order
from course_utils.workload.data.logs import Batch, ClickLogs
from course_utils.workload.data.parquet import open_parquet, parquet_info, read_row_groups, row_groups_of_rank

__all__ = ["ParquetBatches"]


class ParquetBatches(IterableDataset):
    """Rank ``rank``'s batches of the parquet file ``path``, one epoch per iteration.

    ``len()`` is the number of batches of an epoch (of what is left of it, after a history);
    ``set_epoch(epoch, history=())`` picks the epoch's order (as ``DistributedSampler.set_epoch``
    does) and the layouts that already used some of it; never called, every epoch is epoch 0.
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
        self.rows_per_group = parquet_info(self.path)["rows_per_group"]
        self.world_size = world_size
        self.groups = row_groups_of_rank(len(self.rows_per_group), rank, world_size, self.path)
        self.group_rows = [self.rows_per_group[g] for g in self.groups]
        self.stats = {"groups_read": 0, "rows_read": 0, "batches": 0}
        self._share = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int, history: list[Segment] | tuple = ()) -> None:
        self.epoch, self.history = epoch, [tuple(int(x) for x in segment) for segment in history]
        self._used = used_rows(self.rows_per_group, self.seed, epoch, self.history, self.path)
        self.steps = (
            min(  # every rank stops with the one whose unused rows run out first
                rows_left(
                    self._used, row_groups_of_rank(len(self.rows_per_group), r, self.world_size, self.path)
                )
                for r in range(self.world_size)
            )
            // self.batch_size
        )

    def __len__(self) -> int:
        return self.steps

    def _orders(self) -> Iterator[tuple[int, np.ndarray]]:
        """This epoch's ``(position of a row group among this rank's, its unused rows in visiting
        order)``, for the row groups that still have any."""
        position = {g: i for i, g in enumerate(self.groups)}
        for group, order in visiting_order(self.rows_per_group, self.groups, self.seed, self.epoch):
            unused = order[~self._used[group][order]]
            if len(unused):
                yield position[group], unused

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
