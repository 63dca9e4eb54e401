"""Evaluating a data-parallel model: metrics summed over ranks, and the AUC, which cannot be.

Each rank scores its own share of the held-out rows. A loss is a mean, so the ranks all-reduce
``(sum of losses, row count)`` and divide: the exact figure (``ddp_canonical.summed_loss``). The
AUC is the share of (click, non-click) *pairs* ranked in the right order; most pairs have their
two rows on different ranks. The mean of the ranks' own AUCs leaves those pairs out, and is off
as soon as the ranks' rows differ (a data set split by files, by day, by region). The exact AUC
gathers every rank's ``(label, score)`` and ranks them once
(``course_utils.workload.global_auc.distributed_auc``, the production job's).

``auc_two_ways`` computes both on every rank, from rows split the way files split them.

Taught in chapter 04 (appendix 04a, section 5).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from course_utils.workload.global_auc import distributed_auc
from course_utils.workload.metrics import auc

__all__ = ["auc_two_ways"]


def auc_two_ways(labels: np.ndarray, scores: np.ndarray, shard_key: np.ndarray | None = None) -> dict:
    """On every rank (call through ``launch``): this rank's rows are ``r, r + w, ...``
    (``DistributedSampler`` without shuffling), or, given a ``shard_key``, those of its quantile of
    the key (rank 0 the lowest ``1/w``, ...), as in a data set split into files by some column.
    ``labels [N]`` 0/1, ``scores [N]``, ``shard_key [N]``: all rows, the same on every rank.

    Returns ``{"rows", "own AUC": this rank's rows alone, "mean of per-rank AUCs", "exact AUC"}``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if shard_key is None:
        mine = np.arange(rank, len(labels), world)
    else:
        mine = np.array_split(np.argsort(shard_key, kind="stable"), world)[rank]  # this rank's "files"
    own = auc(labels[mine], scores[mine])
    every = torch.tensor([own], dtype=torch.float64)
    dist.all_reduce(every)
    return {
        "rows": len(mine),
        "own AUC": own,
        "mean of per-rank AUCs": every.item() / world,
        "exact AUC": distributed_auc(labels[mine], scores[mine]),
    }
