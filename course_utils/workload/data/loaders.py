"""Loaders: what the training loop (``course_utils.workload.train.fit``) iterates, one epoch at a time.

Each is a sized iterable of :class:`~course_utils.workload.data.logs.Batch` with ``set_epoch(epoch)``,
like a torch ``DataLoader`` over a dataset with a ``DistributedSampler``::

    InMemoryBatches(logs, batch_size, seed)   one process, every row, shuffled with seed + epoch
    SampledBatches(logs, batch_size, rank, world_size, seed)
                                              a rank's rows of in-memory logs, as torch's
                                              DistributedSampler picks them
    ParquetBatches(path, batch_size, rank, world_size, seed)
                                              a rank's parquet row groups, streamed (``stream.py``)
    GlobalBatches(loaders)                    the ranks' batches side by side: one process
                                              training on them trains like the ranks together
    MapBatches(loader, fn)                    fn applied to each batch (e.g. a rank's rows of it)
    rank_loader(data, ...)                    the first three, chosen by the type of ``data``

Batches are made as the loop asks for them, never a whole epoch ahead.

Taught in chapter 04.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from course_utils.runtime.checks import check_whole
from course_utils.workload.data.logs import Batch, ClickLogs
from course_utils.workload.data.stream import ParquetBatches

__all__ = [
    "sampler_indices",
    "InMemoryBatches",
    "SampledBatches",
    "ParquetBatches",
    "GlobalBatches",
    "MapBatches",
    "rank_loader",
]


def sampler_indices(
    n_rows: int, rank: int, world_size: int, epoch: int, seed: int = 0, set_epoch: bool = True
) -> list[int]:
    """Row indices rank ``rank`` visits in ``epoch``, from ``torch.utils.data.DistributedSampler``.

    The sampler shuffles all rows with seed ``seed + epoch`` (the epoch comes from
    ``set_epoch``; without it, every epoch is epoch 0), pads the list to a multiple of
    ``world_size`` by repeating its start, and gives rank r positions r, r + W, r + 2W, ...
    """
    sampler = DistributedSampler(range(n_rows), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    if set_epoch:
        sampler.set_epoch(epoch)
    return list(sampler)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Epochs:
    """What every loader shares: the epoch it is at."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class InMemoryBatches(_Epochs):
    """All rows of ``logs`` in batches of ``batch_size`` (the last one smaller), in the order
    ``logs.batches(shuffle=True, seed=seed + epoch)`` gives."""

    def __init__(self, logs: ClickLogs, batch_size: int, seed: int = 0):
        check_whole("batch_size", batch_size)
        self.logs, self.batch_size, self.seed = logs, batch_size, seed

    def __len__(self) -> int:
        return _ceil_div(len(self.logs), self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        return self.logs.batches(self.batch_size, shuffle=True, seed=self.seed + self.epoch)


class SampledBatches(_Epochs):
    """Rank ``rank``'s rows of ``logs`` (every rank holds them all), as ``DistributedSampler``
    with ``seed`` picks them for the epoch, in batches of ``batch_size`` (the last one smaller)."""

    def __init__(self, logs: ClickLogs, batch_size: int, rank: int, world_size: int, seed: int = 0):
        check_whole("batch_size", batch_size)
        self.logs, self.batch_size, self.seed = logs, batch_size, seed
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        per_rank = _ceil_div(len(self.logs), self.world_size)  # the sampler pads to a multiple of W
        return _ceil_div(per_rank, self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        idx = np.asarray(sampler_indices(len(self.logs), self.rank, self.world_size, self.epoch, self.seed))
        for i in range(0, len(idx), self.batch_size):
            yield self.logs[idx[i : i + self.batch_size]].to_torch()


class GlobalBatches(_Epochs):
    """At each step, the batches of ``loaders`` (one per rank) concatenated in rank order."""

    def __init__(self, loaders: list):
        self.loaders = loaders

    def set_epoch(self, epoch: int) -> None:
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def __len__(self) -> int:
        return min(len(loader) for loader in self.loaders)

    def __iter__(self) -> Iterator[Batch]:
        for step in zip(*self.loaders, strict=False):
            yield Batch(*(torch.cat(parts) for parts in zip(*step, strict=False)))


class MapBatches(_Epochs):
    """``fn(batch)`` for each batch of ``loader``."""

    def __init__(self, loader, fn: Callable[[Batch], Batch]):
        self.loader, self.fn = loader, fn

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        return map(self.fn, self.loader)


def rank_loader(
    data: ClickLogs | str | Path,
    rank: int,
    world_size: int,
    batch_size: int,
    seed: int = 0,
    in_memory: bool = False,
):
    """Rank ``rank``'s loader of ``data``: :class:`SampledBatches` of ``ClickLogs`` in memory, or
    :class:`ParquetBatches` of a parquet path (its own row groups, streamed; ``in_memory=True``:
    read once and kept)."""
    if isinstance(data, ClickLogs):
        return SampledBatches(data, batch_size, rank, world_size, seed)
    return ParquetBatches(data, batch_size, rank, world_size, seed=seed, in_memory=in_memory)
