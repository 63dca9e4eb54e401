"""Who owns what: a sharding plan says which rank holds which table, rows or columns.

Three ways to spread ``T`` embedding tables (table ``t``: ``cardinalities[t]`` rows x ``dim``
columns) over ``world_size`` ranks, named as in TorchRec:

* **table-wise**: every table whole on one rank (largest tables first, each onto the rank
  holding the fewest bytes so far);
* **row-wise**: every table cut into ``world_size`` row shards, one per rank, by **range**
  (blocks of ``ceil(N / W)`` rows, as TorchRec and DTensor cut them) or by **hash**
  (``id % W``: shard ``s`` holds rows ``s, s + W, s + 2W, ...``);
* **column-wise**: every table cut into ``world_size`` column blocks of ``ceil(dim / W)``.

A :class:`Shard` names its table, its rank and the rows and columns it holds;
``shard.of(full_weight)`` is that piece of the unsharded table, which is how the tests
compare a sharded lookup (and its gradients) with the unsharded one.

Taught in chapter 07 (section 2, three ways to cut the tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_utils.model_parallel.vertical import place_largest_first
from course_utils.runtime.checks import check_sizes, check_whole

__all__ = [
    "SHARDING_KINDS",
    "AT_SCALE_KINDS",
    "Shard",
    "ShardingPlan",
    "plan_table_wise",
    "plan_row_wise",
    "plan_column_wise",
    "make_plan",
    "PLANNERS",
]

SHARDING_KINDS = ("table_wise", "row_wise", "column_wise")
#: TorchRec's other kinds, built in appendix 07c (``table_row_wise``, ``grid``, ``replicated_tables``).
AT_SCALE_KINDS = ("table_row_wise", "grid_shard", "data_parallel")


@dataclass(frozen=True)
class Shard:
    """Rows ``range(*rows, stride)`` and columns ``range(*cols)`` of table ``table``, held by ``rank``.

    ``stride`` is 1 for a block of rows, ``world_size`` for a hash (modulo) shard.
    """

    table: int
    rank: int
    rows: tuple
    cols: tuple
    stride: int = 1

    @property
    def num_rows(self) -> int:
        return len(range(self.rows[0], self.rows[1], self.stride))

    @property
    def num_cols(self) -> int:
        return self.cols[1] - self.cols[0]

    def nbytes(self, itemsize: int = 4) -> int:
        """Bytes of this shard's weights."""
        return self.num_rows * self.num_cols * itemsize

    def of(self, full: torch.Tensor) -> torch.Tensor:
        """This shard's piece of the unsharded table ``full [N, D]`` (a view): ``[num_rows, num_cols]``."""
        return full[self.rows[0] : self.rows[1] : self.stride, self.cols[0] : self.cols[1]]


@dataclass(frozen=True)
class ShardingPlan:
    """A complete assignment of every table's rows and columns to ranks.

    kind: one of :data:`SHARDING_KINDS`. row_split: ``"range"`` or ``"hash"`` (row-wise only).
    shards: every shard, ordered by rank, then table.
    """

    kind: str
    cardinalities: tuple
    dim: int
    world_size: int
    shards: tuple
    row_split: str = "range"

    @property
    def n_tables(self) -> int:
        return len(self.cardinalities)

    def shards_of(self, rank: int) -> list[Shard]:
        """The shards rank ``rank`` holds, ordered by table."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return [s for s in self.shards if s.rank == rank]

    def tables_of(self, rank: int) -> list[int]:
        """The tables of which rank ``rank`` holds a piece (table-wise: its whole tables)."""
        return [s.table for s in self.shards_of(rank)]

    def owner_of_row(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Row-wise plans: the rank holding each id of ``table`` (``ids`` any shape, int64)."""
        if self.kind != "row_wise":
            raise ValueError(f"owner_of_row is for row-wise plans; this plan is {self.kind}")
        if self.row_split == "hash":
            return ids % self.world_size
        return ids // _ceil_div(self.cardinalities[table], self.world_size)

    def bytes_per_rank(self, itemsize: int = 4) -> list[int]:
        """Weight bytes each rank holds, ``[world_size]``."""
        held = [0] * self.world_size
        for s in self.shards:
            held[s.rank] += s.nbytes(itemsize)
        return held

    def describe(self) -> str:
        """One line per rank: which pieces of which tables it holds, and their size."""
        lines = [
            f"{self.kind.replace('_', '-')} plan"
            + (f" ({self.row_split} split)" if self.kind == "row_wise" else "")
            + f": {self.n_tables} tables x dim {self.dim} over {self.world_size} ranks"
        ]
        for rank, nbytes in enumerate(self.bytes_per_rank()):
            parts = []
            for s in self.shards_of(rank):
                if self.kind == "table_wise":
                    parts.append(f"t{s.table}")
                elif self.kind == "row_wise":
                    rows = f"{s.rows[0]}::{s.stride}" if s.stride > 1 else f"{s.rows[0]}:{s.rows[1]}"
                    parts.append(f"t{s.table}[{rows}]")
                else:
                    parts.append(f"t{s.table}[:, {s.cols[0]}:{s.cols[1]}]")
            shown = ", ".join(parts[:4]) + (f", ... ({len(parts)} pieces)" if len(parts) > 4 else "")
            lines.append(f"  rank {rank}: {nbytes / 2**20:7.2f} MiB  {shown or '(nothing)'}")
        return "\n".join(lines)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check(cardinalities: Sequence[int], dim: int, world_size: int) -> tuple:
    check_whole("dim", dim)
    check_whole("world_size", world_size)
    return check_sizes(cardinalities)


def plan_table_wise(cardinalities: Sequence[int], dim: int, world_size: int) -> ShardingPlan:
    """Each table whole on one rank: largest first onto the rank with the fewest bytes so far
    (``place_largest_first``, chapter 05's rule for tables on devices)."""
    cards = _check(cardinalities, dim, world_size)
    owner = place_largest_first(cards, world_size)
    shards = [Shard(t, owner[t], (0, cards[t]), (0, dim)) for t in range(len(cards))]
    return ShardingPlan(
        "table_wise", cards, dim, world_size, tuple(sorted(shards, key=lambda s: (s.rank, s.table)))
    )


def plan_row_wise(
    cardinalities: Sequence[int], dim: int, world_size: int, split: str = "range"
) -> ShardingPlan:
    """Every table cut into one row shard per rank: blocks of ``ceil(N / W)`` rows
    (``split="range"``; the last blocks may be smaller, even empty) or ``id % W`` (``"hash"``)."""
    cards = _check(cardinalities, dim, world_size)
    if split not in ("range", "hash"):
        raise ValueError(f"split must be 'range' or 'hash', got {split!r}")
    shards = []
    for rank in range(world_size):
        for t, n in enumerate(cards):
            if split == "hash":
                shards.append(Shard(t, rank, (rank, n), (0, dim), stride=world_size))
            else:
                block = _ceil_div(n, world_size)
                shards.append(Shard(t, rank, (min(rank * block, n), min((rank + 1) * block, n)), (0, dim)))
    return ShardingPlan("row_wise", cards, dim, world_size, tuple(shards), row_split=split)


def plan_column_wise(cardinalities: Sequence[int], dim: int, world_size: int) -> ShardingPlan:
    """Every table cut into one column block of ``ceil(dim / W)`` columns per rank."""
    cards = _check(cardinalities, dim, world_size)
    block = _ceil_div(dim, world_size)
    if block * (world_size - 1) >= dim:
        raise ValueError(
            f"column-wise sharding of dim {dim} over {world_size} ranks leaves a rank "
            f"without columns (blocks of {block}); use dim >= {block * (world_size - 1) + 1}, "
            "fewer ranks, or row-wise sharding"
        )
    shards = [
        Shard(t, rank, (0, n), (rank * block, min((rank + 1) * block, dim)))
        for rank in range(world_size)
        for t, n in enumerate(cards)
    ]
    return ShardingPlan("column_wise", cards, dim, world_size, tuple(shards))


#: How each kind's plan is made: ``PLANNERS[kind](cardinalities, dim, world_size, **options)``.
#: Appendix 07c's modules (``table_row_wise``, ``grid``, ``replicated_tables``) add their kinds, which
#: the package's ``__init__`` imports, so they are here whenever ``course_utils.sharding`` is.
PLANNERS = {"table_wise": plan_table_wise, "row_wise": plan_row_wise, "column_wise": plan_column_wise}


def make_plan(kind: str, cardinalities: Sequence[int], dim: int, world_size: int, **options) -> ShardingPlan:
    """``make_plan("row_wise", cards, 16, 4, split="hash")``: the plan of ``kind`` (one of
    :data:`SHARDING_KINDS` or :data:`AT_SCALE_KINDS`, which take ``ranks_per_host=``)."""
    if kind not in PLANNERS:
        raise ValueError(
            f"unknown sharding kind {kind!r}; choose one of {', '.join(SHARDING_KINDS + AT_SCALE_KINDS)}"
        )
    return PLANNERS[kind](cardinalities, dim, world_size, **options)
