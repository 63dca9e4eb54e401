"""What appendix 07c measures: each new lookup against ``nn.EmbeddingBag`` on real ranks, and the
lookups' communication per step on a modeled cluster of 2 to 8 hosts of 8 GPUs.

* ``compare_with_embedding_bag``: run in every rank; one forward and backward of a sharded lookup
  beside ``nn.EmbeddingBag`` on all ranks' ids; max differences and the bytes this rank sent;
* ``price``: seconds of one step's collectives on a two-tier network (a ``Cluster``'s ``Wire``),
  from the bytes each rank sends each other rank (``link_bytes``): every collective is priced as
  the modeled cluster prices it when real ranks issue it (``course_utils.runtime.cluster``): an
  all-to-all over ``w`` ranks takes ``(w-1) alpha + max(sent, received) / beta``, its busiest rank
  setting the pace, on the slower tier when its ranks span hosts; groups that run side by side
  (each host's) take as long as the slowest; collectives run one after another;
* ``modeled_comparison``: every scheme priced for each number of hosts. 16 to 64 real ranks are too
  many for a 2-core machine, so the bytes there come from ``link_bytes.matrices`` (checked equal to
  the metered bytes on 4 real ranks) and only the network is modeled. The lookups' own compute
  (reading rows from HBM) is left out: every scheme reads the same rows.

Taught in chapter 07 (appendix 07c, sharding at scale).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_utils.runtime import cluster as modeled
from course_utils.runtime.cluster import Cluster, collective_seconds
from course_utils.sharding import link_bytes
from course_utils.sharding.lookups import shard_embeddings
from course_utils.sharding.plan import make_plan
from course_utils.workload import data

__all__ = [
    "compare_with_embedding_bag",
    "compare_kinds",
    "timed_collectives",
    "problem",
    "SCHEDULES",
    "price",
    "modeled_comparison",
]


def problem(cards, dim: int, world: int, batch: int, pooling: int, seed: int = 0):
    """Tables ``[N_t, D]``, every rank's ids ``[W B, T, L]`` and an upstream gradient ``[W B, T, D]``."""
    g = torch.Generator().manual_seed(seed)
    tables = [torch.randn(n, dim, generator=g) for n in cards]
    ids = torch.stack([torch.randint(0, n, (world * batch, pooling), generator=g) for n in cards], 1)
    return tables, ids, torch.randn(world * batch, len(cards), dim, generator=g)


def compare_with_embedding_bag(
    kind: str, options: dict, cards, dim: int, batch: int, pooling: int = 2
) -> dict:
    """Run in every rank: the sharded lookup of ``kind`` (plan ``options``) on this rank's ``batch``
    bags, forward and backward (upstream gradient fixed), against one ``nn.EmbeddingBag(mode="sum")``
    per table on every rank's bags. Returns ``{"forward", "grad"}`` (max absolute differences: the pooled
    vectors, and each shard's gradient against its piece of the table's) and ``"traffic"``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tables, ids, upstream = problem(cards, dim, world, batch, pooling)
    lookup = shard_embeddings(make_plan(kind, cards, dim, world, **options), tables)
    mine = slice(rank * batch, (rank + 1) * batch)
    pooled = lookup(ids[mine])
    (pooled * upstream[mine]).sum().backward()
    bags = [nn.EmbeddingBag.from_pretrained(t.clone(), freeze=False, mode="sum") for t in tables]
    reference = torch.stack([bag(ids[:, t]) for t, bag in enumerate(bags)], dim=1)
    (reference * upstream).sum().backward()
    grads = [(g - s.of(bags[s.table].weight.grad)).abs().max().item() for s, g in lookup.shard_gradients()]
    return {
        "forward": (pooled - reference[mine]).abs().max().item(),
        "grad": max([g for g in grads if g == g] or [0.0]),
        "traffic": lookup.traffic.as_dict(),
    }


def compare_kinds(cases, cards, dim: int, batch: int, pooling: int = 2) -> list:
    """Run in every rank: :func:`compare_with_embedding_bag` for each ``(kind, options)`` of
    ``cases``, in one launch."""
    return [compare_with_embedding_bag(kind, options, cards, dim, batch, pooling) for kind, options in cases]


def timed_collectives(kind: str, options: dict, cards, dim: int, batch: int, pooling: int = 2) -> dict:
    """Run in every rank of a modeled cluster (``launch(..., cluster=...)``): one forward and backward
    of the lookup. Returns ``{"ns": [each all-to-all's modeled ns, in order], "traffic": ...}``, the
    cluster's own timing of the collectives that :func:`price` prices from the bytes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tables, ids, upstream = problem(cards, dim, world, batch, pooling)
    lookup = shard_embeddings(make_plan(kind, cards, dim, world, **options), tables)
    mine = slice(rank * batch, (rank + 1) * batch)
    start = modeled.modeled_ns()
    (lookup(ids[mine]) * upstream[mine]).sum().backward()
    spans = [s for s in modeled.timeline().spans if s.name.startswith("all_to_all") and s.start_ns >= start]
    return {
        "ns": [s.duration_ns for s in sorted(spans, key=lambda s: s.start_ns)],
        "traffic": lookup.traffic.as_dict(),
    }


#: Each scheme's collectives in the order they run: ``(operation, phase, ranks)``, ``ranks`` one of
#: ``"world"``, ``"host"`` (each host's ranks, side by side), ``"cross"`` (one rank per host, same
#: local rank). 2-D sparse parallelism: its inner kind's collectives with "world" meaning the host,
#: then the replicas' all-reduce across hosts ("2d:<kind>").
SCHEDULES = {
    "table_wise": [("all_to_all", p, "world") for p in ("ids", "embeddings", "gradients")],
    "column_wise": [("all_to_all", p, "world") for p in ("ids", "embeddings", "gradients")],
    "row_wise": [("all_to_all", p, "world") for p in ("counts", "ids", "embeddings", "gradients")],
    "table_row_wise": [
        ("all_to_all", "counts", "world"),
        ("all_to_all", "ids", "world"),
        ("all_to_all", "embeddings", "host"),
        ("all_to_all", "embeddings", "cross"),
        ("all_to_all", "gradients", "cross"),
        ("all_to_all", "gradients", "host"),
    ],
    "data_parallel": [("all_reduce", "gradients", "world")],
}
SCHEDULES["grid_shard"] = SCHEDULES["table_row_wise"]


def _groups(which: str, world: int, per_host: int) -> list[list[int]]:
    if which == "world":
        return [list(range(world))]
    if which == "host":
        return [list(range(k, k + per_host)) for k in range(0, world, per_host)]
    return [list(range(k, world, per_host)) for k in range(per_host)]


def _seconds(op: str, m, ranks: list[int], wire) -> float:
    """One group's collective: all-to-all of the bytes ``m`` moves inside ``ranks``; an all-reduce
    is a reduce-scatter and an all-gather, each half of them."""
    if len(ranks) < 2:
        return 0.0
    sent = [sum(m[r][d] for d in ranks) for r in ranks]
    received = [sum(m[s][r] for s in ranks) for r in ranks]
    nbytes = max(max(a, b) for a, b in zip(sent, received, strict=True))
    alpha, beta = wire.link(ranks)
    if op == "all_reduce":
        return 2 * collective_seconds("all_to_all", nbytes / 2, len(ranks), alpha, beta)
    return collective_seconds("all_to_all", nbytes, len(ranks), alpha, beta)


def price(kind: str, mats: dict, cluster: Cluster, sync_every: int = 1) -> dict:
    """``{"<operation> <phase> <ranks>": seconds, ..., "total": seconds}`` of one step of ``kind``
    (a key of :data:`SCHEDULES`, or ``"2d:<kind>"``), its bytes ``mats`` (``link_bytes``), on
    ``cluster`` (a two-tier network: ``Cluster(..., gpus_per_node=8)``). ``sync_every``: 2-D's
    replicas all-reduce every that many steps (its time divided by it)."""
    wire = cluster.network
    world, per_host = len(mats["ids"]), wire.ranks_per_node or 1
    inner = kind.removeprefix("2d:")
    steps = list(SCHEDULES[inner])
    if kind.startswith("2d:"):  # the inner kind inside each host, then the replicas across hosts
        steps = [(op, phase, "host") for op, phase, _ in steps] + [("all_reduce", "sync", "cross")]
    out = {}
    for op, phase, which in steps:
        share = 1 / sync_every if phase == "sync" else 1
        seconds = max(_seconds(op, mats[phase], ranks, wire) for ranks in _groups(which, world, per_host))
        out[f"{op} {phase} {which}"] = out.get(f"{op} {phase} {which}", 0.0) + seconds * share
    out["total"] = sum(out.values())
    return out


def modeled_comparison(
    cards, dim: int, batch: int, hosts, schemes, cluster_of, sync_every: int = 1, seed: int = 0
) -> dict:
    """``{(scheme, hosts): price(...)}`` for every scheme (``(label, kind, options)``; a kind
    ``"2d:<kind>"`` shards inside each host) and number of hosts, on ``cluster_of(hosts)``'s
    network, each GPU looking up ``batch`` rows of the synthetic click log (Zipf ids, ``seed``)."""
    out = {}
    for h in hosts:
        cluster = cluster_of(h)
        per_host = cluster.network.ranks_per_node
        world = h * per_host
        logs = data.make_click_logs(world * batch, seed=seed, cardinalities=cards, n_dense=1)
        ids = list(torch.from_numpy(logs.sparse).view(world, batch, -1))
        for label, kind, options in schemes:
            if kind.startswith("2d:"):
                plan = make_plan(kind[3:], cards, dim, per_host, **options)
                mats = link_bytes.two_d_matrices(plan, world, ids)
            else:
                extra = {"ranks_per_host": per_host} if kind in ("table_row_wise", "grid_shard") else {}
                mats = link_bytes.matrices(make_plan(kind, cards, dim, world, **options, **extra), ids)
            out[label, h] = price(kind, mats, cluster, sync_every)
    return out
