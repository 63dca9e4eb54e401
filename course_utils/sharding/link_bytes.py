"""Bytes per step between every pair of ranks: the formula for every sharding kind, and the
measurement it must equal exactly.

``matrices(plan, ids_per_rank)`` gives ``{phase: m}`` with ``m[src][dst]`` the bytes rank ``src``
sends rank ``dst`` in one forward and backward pass (``B`` rows per rank, ``T`` tables of width
``D``, ``L`` ids per bag, int64 ids, float32 values, ``W = H G`` ranks in ``H`` hosts of ``G``);
``measured(traffic_per_rank)`` is the same from the ranks' ``Traffic`` records. Summed over all
ranks (``totals``), the formulas are (chapter 07's three kinds: ``volume.formula``):

==================  =====================  =================================  ==============
kind                ids out                pooled vectors back (= gradients)  replicas' sync
==================  =====================  =================================  ==============
table-row-wise      8 W (W-1) counts +     4 B T D (W (G-1) + G (H-1)):       -
                    16 x (ids routed to    partial sums inside hosts, then
                    another rank)          finished vectors across hosts
grid (C blocks)     same, each id sent     the same (``P w = T D``)           -
                    to C pieces
data-parallel       0                      0 (gradients: 8 (W-1) sum N_t D)   -
2-D (R groups)      chapter 07's, over G   chapter 07's, over G, R times      8 (R-1) V
==================  =====================  =================================  ==============

(2-D: ``V`` values in one copy of the tables, ``D sum N_t``.) Backward sends each forward piece's
gradient back along the reverse path, so ``gradients[s][d] = embeddings[d][s]`` except for
data-parallel tables, whose gradients move in an all-reduce (reduce-scatter, then all-gather).

Taught in chapter 07 (appendix 07c, sharding at scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course_utils.sharding.plan import ShardingPlan
from course_utils.sharding.replicated_tables import chunk_sizes
from course_utils.sharding.row_wise import route
from course_utils.sharding.table_row_wise import host_route
from course_utils.sharding.volume import ID_BYTES, VALUE_BYTES

__all__ = ["matrices", "two_d_matrices", "measured", "totals", "routed", "closed_form", "across_hosts"]


def _zeros(world: int) -> list[list[int]]:
    return [[0] * world for _ in range(world)]


def _bags(ids: torch.Tensor) -> torch.Tensor:
    return ids.unsqueeze(-1) if ids.dim() == 2 else ids


def routed(plan: ShardingPlan, ids_per_rank: Sequence[torch.Tensor]) -> list[list[int]]:
    """``r[src][dst]``: ids of rank ``src``'s batch that rank ``dst`` holds (row-wise, table-row-wise
    and grid plans; a grid id counts once per column block)."""
    W = plan.world_size
    bags = torch.cat([_bags(ids) for ids in ids_per_rank])  # [W B, T, L], every rank's at once
    owner = route(plan, bags)[0] if plan.kind == "row_wise" else host_route(plan, bags)[0]
    source = torch.arange(len(ids_per_rank)).repeat_interleave(len(ids_per_rank[0])).view(-1, 1, 1)
    pairs = (source * W + owner).flatten()
    return torch.bincount(pairs, minlength=len(ids_per_rank) * W).view(-1, W).tolist()


def _all_reduce(m: list, ranks: Sequence[int], n: int) -> None:
    """Add a reduce-scatter + all-gather of ``n`` values among ``ranks`` into ``m``."""
    sizes = chunk_sizes(n, len(ranks))
    for i, src in enumerate(ranks):
        for j, dst in enumerate(ranks):
            if i != j:
                m[src][dst] += VALUE_BYTES * (sizes[j] + sizes[i])


def _host_vectors(plan, emb: list, B: int) -> None:
    """Table-row-wise and grid: the pooled vectors, ``emb[src][dst]``."""
    W, G, H = plan.world_size, plan.ranks_per_host, plan.hosts
    width = plan.dim // plan.column_blocks
    for s in range(W):
        held = len(plan.pieces_on(s // G))
        for r in range(W):
            if r != s and r // G == s // G:  # partial sums inside the host
                emb[s][r] = VALUE_BYTES * H * held * B * width
            elif r != s and r % G == s % G:  # finished vectors across hosts
                emb[s][r] = VALUE_BYTES * held * B * width


def matrices(plan: ShardingPlan, ids_per_rank: Sequence[torch.Tensor]) -> dict:
    """``{"counts", "ids", "embeddings", "gradients": m[src][dst]}`` for one forward and backward
    of ``plan``'s lookup, rank ``r`` looking up ``ids_per_rank[r]`` (``[B, T]`` or ``[B, T, L]``)."""
    W, D, T = plan.world_size, plan.dim, plan.n_tables
    B, _, L = _bags(ids_per_rank[0]).shape
    out = {phase: _zeros(W) for phase in ("counts", "ids", "embeddings")}
    ids, emb = out["ids"], out["embeddings"]
    kind = plan.kind
    if kind in ("table_wise", "column_wise"):
        for s in range(W):
            mine = plan.shards_of(s)
            for r in range(W):
                if r != s:
                    ids[r][s] = ID_BYTES * B * (len(mine) if kind == "table_wise" else T) * L
                    emb[s][r] = VALUE_BYTES * B * sum(sh.num_cols for sh in mine)
    elif kind in ("row_wise", "table_row_wise", "grid_shard"):
        sent = routed(plan, ids_per_rank)
        for r in range(W):
            for s in range(W):
                if r != s:
                    out["counts"][r][s] = ID_BYTES
                    ids[r][s] = 2 * ID_BYTES * sent[r][s]
                    if kind == "row_wise":
                        emb[s][r] = VALUE_BYTES * T * B * D
        if kind != "row_wise":
            _host_vectors(plan, emb, B)
    elif kind == "data_parallel":
        grads = _zeros(W)
        _all_reduce(grads, range(W), D * sum(plan.cardinalities))
        return {**out, "gradients": grads}
    else:
        raise ValueError(f"no byte formula for sharding kind {kind!r}")
    out["gradients"] = [[emb[d][s] for d in range(W)] for s in range(W)]
    return out


def two_d_matrices(
    plan: ShardingPlan, world: int, ids_per_rank: Sequence[torch.Tensor], layout: str = "contiguous"
) -> dict:
    """The phases of :func:`matrices` for 2-D sparse parallelism (``plan``: one sharding group's, over
    ``G = plan.world_size`` ranks; ``world`` ranks in all), plus ``"sync"``: the replicas' all-reduce
    of each rank's shards (gradients or weights, the same bytes)."""
    G = plan.world_size
    R = world // G
    groups = (
        [list(range(g * G, (g + 1) * G)) for g in range(R)]
        if layout == "contiguous"
        else [list(range(g, world, R)) for g in range(R)]
    )
    out = {phase: _zeros(world) for phase in ("counts", "ids", "embeddings", "gradients", "sync")}
    for ranks in groups:
        inner = matrices(plan, [ids_per_rank[r] for r in ranks])
        for phase, m in inner.items():
            for i, src in enumerate(ranks):
                for j, dst in enumerate(ranks):
                    out[phase][src][dst] += m[i][j]
    for i in range(G):
        n = sum(s.num_rows * s.num_cols for s in plan.shards_of(i))
        _all_reduce(out["sync"], [g[i] for g in groups], n)
    return out


def measured(traffic_per_rank: Sequence[dict]) -> dict:
    """``{phase: m[src][dst]}`` from every rank's ``Traffic.as_dict()`` (rank order)."""
    return {phase: [list(t[phase]) for t in traffic_per_rank] for phase in traffic_per_rank[0]}


def totals(mats: dict) -> dict:
    """``{phase: bytes summed over all pairs, "total": ...}``."""
    out = {phase: sum(map(sum, m)) for phase, m in mats.items()}
    out["total"] = sum(out.values())
    return out


def across_hosts(mats: dict, ranks_per_host: int) -> tuple[int, int]:
    """``(bytes that leave their host, bytes that stay inside one)``, all phases together."""
    world = len(next(iter(mats.values())))
    crossing = inside = 0
    for m in mats.values():
        for s in range(world):
            for d in range(world):
                if s // ranks_per_host != d // ranks_per_host:
                    crossing += m[s][d]
                else:
                    inside += m[s][d]
    return crossing, inside


def closed_form(plan: ShardingPlan, ids_per_rank: Sequence[torch.Tensor]) -> dict:
    """The module docstring's totals, phase by phase (``{phase: bytes, "total": ...}``), for
    table-row-wise, grid and data-parallel plans."""
    W, D, T = plan.world_size, plan.dim, plan.n_tables
    B = ids_per_rank[0].shape[0]
    if plan.kind == "data_parallel":
        out = dict(
            counts=0, ids=0, embeddings=0, gradients=2 * VALUE_BYTES * (W - 1) * D * sum(plan.cardinalities)
        )
    elif plan.kind in ("table_row_wise", "grid_shard"):
        G, H = plan.ranks_per_host, plan.hosts
        sent = routed(plan, ids_per_rank)
        off_rank = sum(n for r, row in enumerate(sent) for s, n in enumerate(row) if s != r)
        vectors = VALUE_BYTES * B * T * D * (W * (G - 1) + G * (H - 1))
        out = dict(
            counts=ID_BYTES * W * (W - 1), ids=2 * ID_BYTES * off_rank, embeddings=vectors, gradients=vectors
        )
    else:
        raise ValueError(
            f"closed_form covers table_row_wise, grid_shard and data_parallel; got {plan.kind!r}"
        )
    out["total"] = sum(out.values())
    return out
