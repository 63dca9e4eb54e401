"""Where an epoch stands when it was begun by one number of ranks and goes on with another.

A rank of ``ParquetBatches`` owns row groups ``rank, rank + W, ...`` and visits them in an
order drawn from ``seed + epoch`` (:func:`visiting_order`). Which rows a rank has used after
``n`` batches therefore depends on ``W``: a job resumed on ``W' != W`` ranks that only skipped
``n`` batches of its *new* streams would train again on rows the old ranks already used and
never see others. On this course's synthetic data (``train_hybrid``'s defaults), a job stopped
after 60 of 120 steps on 2 ranks and resumed that way on 4 ended with a test AUC 0.025 below the
uninterrupted job's (0.719 against 0.743); resumed from its history, 0.006 below (0.738). Rows
seen twice in one epoch over-fit the embedding tables.

So the position in an epoch is its history: the layouts that worked on it, in order, as
``(world_size, rows per rank per batch, batches)``. Replaying it on the file's metadata alone
(no row is read) tells which rows each of those layouts used (:func:`used_rows`); the new
ranks then stream only the rows nobody has used. With one layout throughout, this is exactly
"skip the first ``n`` batches".

Taught in chapter 08 (the production job resumed on another number of ranks).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from course_utils.workload.data.parquet import row_groups_of_rank

__all__ = ["visiting_order", "used_rows", "rows_left", "Segment"]

#: ``(world_size, rows per rank per batch, batches)``: one layout's part of an epoch.
Segment = tuple[int, int, int]


def visiting_order(
    rows_per_group: Sequence[int], groups: Sequence[int], seed: int, epoch: int
) -> Iterator[tuple[int, np.ndarray]]:
    """``(row group, its row positions in visiting order)`` for a rank owning ``groups``, in the
    epoch's order: the groups permuted by ``PCG64(seed + epoch)``, then each group's rows."""
    rng = np.random.Generator(np.random.PCG64(seed + epoch))
    for i in rng.permutation(len(groups)):
        yield groups[i], rng.permutation(rows_per_group[groups[i]])


def used_rows(
    rows_per_group: Sequence[int], seed: int, epoch: int, history: Sequence[Segment], path="FILE"
) -> list[np.ndarray]:
    """Per row group, a boolean mask ``[rows in the group]`` of the rows the ``history``'s layouts
    used, each rank of each layout taking its own groups' unused rows in visiting order."""
    used = [np.zeros(n, dtype=bool) for n in rows_per_group]
    for world, batch, batches in history:
        taken = []  # every rank of this layout chose from what earlier layouts left
        for rank in range(world):
            need = batch * batches
            for group, order in visiting_order(
                rows_per_group, row_groups_of_rank(len(rows_per_group), rank, world, path), seed, epoch
            ):
                if need == 0:
                    break
                free = order[~used[group][order]][:need]
                taken.append((group, free))
                need -= len(free)
            if need:
                raise ValueError(
                    f"the epoch's history {list(history)} uses more rows than rank {rank} of {world} "
                    "had left: it was not written for this file, seed and epoch"
                )
        for group, free in taken:
            used[group][free] = True
    return used


def rows_left(used: list[np.ndarray], groups: Sequence[int]) -> int:
    """Rows of ``groups`` that no layout has used yet."""
    return int(sum((~used[g]).sum() for g in groups))
