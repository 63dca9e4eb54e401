"""Bytes moved per training step by a sharded lookup: the formula, and the measurement.

Notation: ``W`` ranks, each with a batch of ``B`` rows; ``T`` tables of width ``D``;
``L`` ids per table per row; ids are int64 (8 bytes), embeddings float32 (4 bytes).
Summed over all ranks, one forward and one backward pass move (bytes a rank keeps
for itself are not moved):

============  ======================  ==========================  ======================
kind          ids out                 pooled embeddings back      gradients (backward)
============  ======================  ==========================  ======================
table-wise    8 B T L (W-1)           4 B T D (W-1)               4 B T D (W-1)
column-wise   8 B T L W (W-1)         4 B T D (W-1)               4 B T D (W-1)
row-wise      8 W (W-1) counts +      4 B T D W (W-1)             4 B T D W (W-1)
              16 x (ids routed to     (a partial sum of every
              another rank)           bag from every rank)
============  ======================  ==========================  ======================

Row-wise ids depend on the data: ``routed[r][s]`` is how many of rank ``r``'s ids
live on rank ``s`` (:func:`routed_ids`).

Taught in chapter 07 (section 8, bytes moved per step: formula and measurement).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course_utils.sharding.plan import ShardingPlan
from course_utils.sharding.row_wise import route

__all__ = ["formula", "routed_ids", "measured", "busiest_rank_bytes", "ID_BYTES", "VALUE_BYTES"]

ID_BYTES, VALUE_BYTES = 8, 4


def routed_ids(plan: ShardingPlan, ids_per_rank: Sequence[torch.Tensor]) -> list[list[int]]:
    """``routed[r][s]``: how many ids of rank ``r``'s batch (``ids_per_rank[r]``, ``[B, T]`` or
    ``[B, T, L]``) rank ``s`` holds under a row-wise ``plan``. ``[W][W]`` ints."""
    out = []
    for ids in ids_per_rank:
        bags = ids.unsqueeze(-1) if ids.dim() == 2 else ids
        owner, _ = route(plan, bags)
        out.append(torch.bincount(owner.flatten(), minlength=plan.world_size).tolist())
    return out


def formula(
    kind: str,
    batch_per_rank: int,
    n_tables: int,
    dim: int,
    world_size: int,
    pooling: int = 1,
    routed: Sequence[Sequence[int]] | None = None,
) -> dict:
    """Bytes one training step moves between ranks, by phase, summed over all ranks.

    Returns ``{"counts", "ids", "embeddings", "gradients", "total"}`` (ints). Row-wise
    needs ``routed`` (see :func:`routed_ids`).
    """
    B, T, D, W, L = batch_per_rank, n_tables, dim, world_size, pooling
    if kind == "table_wise":
        out = dict(counts=0, ids=ID_BYTES * B * T * L * (W - 1), embeddings=VALUE_BYTES * B * T * D * (W - 1))
    elif kind == "column_wise":
        out = dict(
            counts=0, ids=ID_BYTES * B * T * L * W * (W - 1), embeddings=VALUE_BYTES * B * T * D * (W - 1)
        )
    elif kind == "row_wise":
        if routed is None or len(routed) != W:
            raise ValueError(
                "row-wise traffic depends on where the ids live: pass routed=routed_ids(plan, ids_per_rank)"
            )
        off_rank = sum(n for r, row in enumerate(routed) for s, n in enumerate(row) if s != r)
        out = dict(
            counts=ID_BYTES * W * (W - 1),
            ids=2 * ID_BYTES * off_rank,
            embeddings=VALUE_BYTES * B * T * D * W * (W - 1),
        )
    else:
        raise ValueError(f"unknown sharding kind {kind!r}; choose table_wise, row_wise or column_wise")
    out["gradients"] = out["embeddings"]
    out["total"] = sum(out.values())
    return out


def measured(traffic_per_rank: Sequence[dict]) -> dict:
    """Sum the ranks' ``Traffic.as_dict()`` records into ``{phase: bytes, "total": bytes}``,
    the same keys as :func:`formula`."""
    phases = traffic_per_rank[0].keys()
    out = {p: sum(sum(t[p]) for t in traffic_per_rank) for p in phases}
    out["total"] = sum(out.values())
    return out


def busiest_rank_bytes(traffic_per_rank: Sequence[dict]) -> int:
    """What sets an all-to-all's pace on a network: per phase, the most bytes any one rank sends
    or receives (its link carries them, and every rank waits for the slowest), summed over the
    phases. Equal to ``measured(...)["total"] / W`` only when the traffic is balanced."""
    world = len(traffic_per_rank)
    total = 0
    for phase in traffic_per_rank[0]:
        sent = [sum(t[phase]) for t in traffic_per_rank]
        received = [sum(t[phase][r] for t in traffic_per_rank) for r in range(world)]
        total += max(max(sent), max(received))
    return total


def matrix(traffic_per_rank: Sequence[dict], phases: Sequence[str]) -> list[list[int]]:
    """``m[src][dst]``: bytes rank ``src`` sent rank ``dst`` in ``phases``."""
    return [[sum(t[p][d] for p in phases) for d in range(len(traffic_per_rank))] for t in traffic_per_rank]
