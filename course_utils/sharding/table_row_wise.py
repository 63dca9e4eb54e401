"""Table-row-wise sharding: each table on one host, its rows cut over that host's ranks.

TorchRec's ``ShardingType.TABLE_ROW_WISE`` ("row-wise on the same node and table-wise across
nodes", ``torchrec/distributed/types.py``). ``W = H * G`` ranks stand for ``H`` hosts of ``G``;
host ``h`` holds ranks ``[h G, (h + 1) G)``. A table is a *piece* placed on one host (largest first,
onto the host holding the fewest bytes), its rows in blocks of ``ceil(N / G)`` over the host's ranks.
Grid sharding (``grid``) cuts each table's columns into several pieces first; the lookup is the same.

Forward on rank ``r = h G + l`` with its batch ``ids [B, T, L]``, as TorchRec's
``TwRwSparseFeaturesDist`` and ``TwRwPooledEmbeddingDist`` (``torchrec/distributed/sharding/
twrw_sharding.py``) move them:

1. **counts, ids out** (one all-to-all over all ranks): each id goes to the rank holding its row,
   as ``(bag, local row)`` pairs, ``bag = p B + b`` for piece ``p``;
2. the owner sums its rows per bag: partial sums ``[W, P_h, B, w]`` (every source rank, the host's
   ``P_h`` pieces of width ``w``);
3. **reduce-scatter inside the host** (an all-to-all plus a sum, by hand): local rank ``l'`` gets
   the partials of the source ranks with local rank ``l'``, ``[H, P_h, B, w]``, and adds them up;
4. **all-to-all across hosts** among the ranks of one local rank: each source rank gets its
   ``[P_h, B, w]`` from every host; the pieces are put back in table order.

The big partial sums of row-wise sharding (step 3) stay on the host's fast links; only finished
vectors (step 4) cross hosts. Backward reverses 4 then 3.

Taught in chapter 07 (appendix 07c, sharding at scale).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn import functional as F

from course_utils.model_parallel.vertical import place_largest_first
from course_utils.runtime.checks import check_sizes, check_whole
from course_utils.sharding.alltoall import exchange
from course_utils.sharding.base import ShardedEmbeddingBags
from course_utils.sharding.plan import PLANNERS, Shard, ShardingPlan

__all__ = [
    "HostShardingPlan",
    "plan_table_row_wise",
    "plan_pieces_on_hosts",
    "host_route",
    "rank_groups",
    "GroupTraffic",
    "TableRowWiseEmbeddingBags",
]


@dataclass(frozen=True)
class HostShardingPlan(ShardingPlan):
    """A plan over hosts of ``ranks_per_host`` ranks. ``pieces[p] = (table, (c0, c1), host)``, in
    order of table then column block (``column_blocks`` per table, 1 for table-row-wise)."""

    ranks_per_host: int = 1
    pieces: tuple = ()
    column_blocks: int = 1

    @property
    def hosts(self) -> int:
        return self.world_size // self.ranks_per_host

    def pieces_on(self, host: int) -> list[int]:
        """The pieces host ``host`` holds, in piece order."""
        return [p for p, (_, _, h) in enumerate(self.pieces) if h == host]

    def describe(self) -> str:
        """One line per host: which pieces (table, columns) it holds, rows split over its ranks."""
        lines = [
            f"{self.kind.replace('_', '-')} plan: {self.n_tables} tables x dim {self.dim} over "
            f"{self.hosts} hosts of {self.ranks_per_host} ranks"
        ]
        for h in range(self.hosts):
            held = sum(s.nbytes() for s in self.shards if s.rank // self.ranks_per_host == h)
            parts = [
                f"t{t}" + (f"[:, {c[0]}:{c[1]}]" if self.column_blocks > 1 else "")
                for t, c, _ in (self.pieces[p] for p in self.pieces_on(h))
            ]
            shown = ", ".join(parts[:6]) + (f", ... ({len(parts)} pieces)" if len(parts) > 6 else "")
            lines.append(f"  host {h}: {held / 2**20:7.2f} MiB, rows cut over its ranks: {shown}")
        return "\n".join(lines)


def plan_pieces_on_hosts(
    kind: str,
    cardinalities: Sequence[int],
    dim: int,
    world_size: int,
    ranks_per_host: int,
    column_blocks: int,
) -> HostShardingPlan:
    """Cut each table into ``column_blocks`` column pieces, place the pieces on hosts (largest first),
    and cut each piece's rows over its host's ranks in blocks of ``ceil(N / ranks_per_host)``."""
    cards = check_sizes(cardinalities)
    for name, value in (("dim", dim), ("world_size", world_size), ("ranks_per_host", ranks_per_host)):
        check_whole(name, value)
    if world_size % ranks_per_host:
        raise ValueError(
            f"world_size {world_size} is not a whole number of hosts of {ranks_per_host} ranks; "
            "choose ranks_per_host dividing world_size"
        )
    hosts = world_size // ranks_per_host
    if dim % column_blocks:
        raise ValueError(f"dim {dim} does not split into {column_blocks} equal column blocks; pick a divisor")
    if len(cards) * column_blocks < hosts:
        raise ValueError(
            f"{len(cards)} tables x {column_blocks} column blocks leave some of the {hosts} hosts "
            "without a piece; use fewer hosts, more column blocks (grid) or more tables"
        )
    width = dim // column_blocks
    sizes = [n * width for n in cards for _ in range(column_blocks)]
    host = place_largest_first(sizes, hosts)
    pieces = tuple(
        (t, (c * width, (c + 1) * width), host[t * column_blocks + c])
        for t in range(len(cards))
        for c in range(column_blocks)
    )
    shards = []
    for rank in range(world_size):
        h, local = divmod(rank, ranks_per_host)
        for t, cols, piece_host in pieces:
            if piece_host == h:
                block = -(-cards[t] // ranks_per_host)
                rows = (min(local * block, cards[t]), min((local + 1) * block, cards[t]))
                shards.append(Shard(t, rank, rows, cols))
    return HostShardingPlan(
        kind,
        cards,
        dim,
        world_size,
        tuple(shards),
        ranks_per_host=ranks_per_host,
        pieces=pieces,
        column_blocks=column_blocks,
    )


def plan_table_row_wise(
    cardinalities: Sequence[int], dim: int, world_size: int, ranks_per_host: int
) -> HostShardingPlan:
    """Each table whole on one host (largest first), its rows cut over the host's ranks."""
    return plan_pieces_on_hosts("table_row_wise", cardinalities, dim, world_size, ranks_per_host, 1)


PLANNERS["table_row_wise"] = plan_table_row_wise


def host_route(plan: HostShardingPlan, bags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Owner rank and row within the owner's shard of every id of every piece: ``bags [B, T, L]`` ->
    two ``[B, P, L]`` int64 tensors (piece ``p`` reads the ids of table ``pieces[p][0]``)."""
    tables = torch.tensor([t for t, _, _ in plan.pieces], device=bags.device)
    hosts = torch.tensor([h for _, _, h in plan.pieces], device=bags.device).view(1, -1, 1)
    block = torch.tensor(
        [-(-plan.cardinalities[t] // plan.ranks_per_host) for t, _, _ in plan.pieces], device=bags.device
    ).view(1, -1, 1)
    ids = bags[:, tables]
    local_rank = ids // block
    return hosts * plan.ranks_per_host + local_rank, ids - local_rank * block


def rank_groups(group_size: int) -> dict:
    """Process groups of ``group_size`` consecutive ranks (a host) and of the ranks ``group_size``
    apart (one per host, same local rank). Every rank must call it, in the same order.
    Returns ``{"block": (group, ranks), "stride": (group, ranks)}``: this rank's two groups."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {}
    blocks = [list(range(k, k + group_size)) for k in range(0, world, group_size)]
    strides = [list(range(k, world, group_size)) for k in range(group_size)]
    for name, partition in (("block", blocks), ("stride", strides)):
        for ranks in partition:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = (group, ranks)
    return mine


class GroupTraffic:
    """Books an exchange inside a sub-group (destinations in group order) into a :class:`Traffic`
    of the whole world (destinations by global rank)."""

    def __init__(self, traffic, ranks: Sequence[int]):
        self.traffic, self.ranks = traffic, list(ranks)

    def record(self, phase: str, nbytes_per_destination: Sequence[int]) -> None:
        full = [0] * self.traffic.world_size
        for i, nbytes in enumerate(nbytes_per_destination):
            full[self.ranks[i]] += nbytes
        self.traffic.record(phase, full)


class TableRowWiseEmbeddingBags(ShardedEmbeddingBags):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]``; this rank holds row blocks of the pieces
    on its host. ``plan``: a :class:`HostShardingPlan`; all ranks build it together (it makes the
    host and cross-host process groups)."""

    def __init__(self, plan: HostShardingPlan, weights=None, **options):
        if options.get("group") is not None:
            raise ValueError("table-row-wise and grid lookups span all ranks: build them without group=")
        super().__init__(plan, weights, **options)
        groups = rank_groups(plan.ranks_per_host)
        self.host_group, host_ranks = groups["block"]
        self.cross_group, cross_ranks = groups["stride"]
        self.host_traffic = GroupTraffic(self.traffic, host_ranks)
        self.cross_traffic = GroupTraffic(self.traffic, cross_ranks)
        self.mine = plan.pieces_on(self.rank // plan.ranks_per_host)  # weights[j] is piece mine[j]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        bags = self._bags(ids)
        B, T, L = bags.shape
        W, G, H, P = plan.world_size, plan.ranks_per_host, plan.hosts, len(plan.pieces)
        width, dev = plan.dim // plan.column_blocks, bags.device
        owner, local = host_route(plan, bags)  # [B, P, L]
        bag = (
            torch.arange(P, device=dev).view(1, P, 1) * B + torch.arange(B, device=dev).view(B, 1, 1)
        ).expand(B, P, L)
        by_owner = owner.flatten().argsort(stable=True)
        pairs = torch.stack([bag.flatten(), local.flatten()], dim=1)[by_owner]  # [B*P*L, 2]
        counts = torch.bincount(owner.flatten(), minlength=W)
        incoming = exchange(list(counts.split(1)), [(1,)] * W, "counts", self.traffic)  # 1.
        n_in = [int(c) for c in incoming]
        got = torch.cat(
            exchange(list(pairs.split(counts.tolist())), [(n, 2) for n in n_in], "ids", self.traffic)
        )
        source = torch.cat([torch.full((n,), s, device=dev) for s, n in enumerate(n_in)])
        slot_of = torch.full((P,), -1, device=dev)
        slot_of[self.mine] = torch.arange(len(self.mine), device=dev)
        j = slot_of[got[:, 0] // B]  # which of this host's pieces each id reads
        by_piece = j.argsort(stable=True)
        per_piece = got[by_piece, 1].split(torch.bincount(j, minlength=len(self.mine)).tolist())
        vectors = torch.cat(
            [F.embedding(r.to(w.device), w) for r, w in zip(per_piece, self.weights, strict=True)]
        )
        Ph = len(self.mine)
        where = (source * Ph + j) * B + got[:, 0] % B  # 2. partial sums [W, P_h, B, w]
        partial = torch.zeros(W * Ph * B, width, device=self.device)
        partial = partial.index_add(0, where[by_piece].to(self.device), vectors).view(H, G, Ph, B, width)
        pieces = list(partial.transpose(0, 1).unbind(0))  # to local rank l': sources (k, l'), [H, P_h, B, w]
        summed = torch.stack(
            exchange(pieces, [(H, Ph, B, width)] * G, "embeddings", self.host_traffic, self.host_group)
        ).sum(0)  # 3. [H, P_h, B, w]
        held = [len(plan.pieces_on(k)) for k in range(H)]
        back = exchange(
            list(summed.unbind(0)),
            [(n, B, width) for n in held],
            "embeddings",
            self.cross_traffic,
            self.cross_group,
        )  # 4.
        order = torch.tensor([p for k in range(H) for p in plan.pieces_on(k)], device=dev).argsort()
        out = torch.cat(back)[order.to(self.device)]  # [P, B, w], pieces in (table, column block) order
        return out.view(T, plan.column_blocks, B, width).permute(2, 0, 1, 3).reshape(B, T, plan.dim)
