"""What the three sharded lookups share: the local shards, id checks, the unsharded reference.

Every sharded lookup has the interface of a DLRM's embedding part: each rank passes
its own mini-batch of ids, ``[B, T]`` (one id per table, as in a DLRM) or
``[B, T, L]`` (``L`` ids per table, summed: a "bag" with pooling factor ``L``), and
gets back the pooled embeddings of its own rows, ``[B, T, D]``, exactly what
:func:`lookup_unsharded` computes from the whole tables. In between, ids travel to
the ranks that hold the rows, and pooled vectors travel back (``exchange``).
Every rank must pass the same ``B`` (the receivers size their buffers from it).

Taught in chapter 07.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from course_utils.runtime.checks import check_ids
from course_utils.runtime.hardware import rank_device
from course_utils.sharding.alltoall import Traffic
from course_utils.sharding.plan import Shard, ShardingPlan

__all__ = ["ShardedEmbeddingBags", "lookup_unsharded", "full_tables"]


def full_tables(source) -> list[torch.Tensor]:
    """The unsharded weights ``[N_t, D]`` of a DLRM (its ``embeddings``), or a list of tensors."""
    if hasattr(source, "embeddings"):
        return [bag.weight for bag in source.embeddings]
    return list(source)


def lookup_unsharded(tables: Sequence[torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The reference: ``ids [B, T]`` or ``[B, T, L]`` int64 -> summed rows ``[B, T, D]``, one
    ``F.embedding_bag(mode="sum")`` per table (what ``nn.EmbeddingBag`` computes)."""
    bags = ids.unsqueeze(-1) if ids.dim() == 2 else ids
    return torch.stack([F.embedding_bag(bags[:, t], w, mode="sum") for t, w in enumerate(tables)], dim=1)


class ShardedEmbeddingBags(nn.Module):
    """Base class: this rank's shards of the plan, as parameters ``weights[i]`` (``shards[i]``).

    weights: the unsharded tables to copy the shards from (a DLRM or a list of ``[N_t, D]``
        tensors), or None to initialise each shard on its own like a DLRM table
        (``U(-1/sqrt(N), 1/sqrt(N))``, seeded by ``seed``, table and rank), so that no
        rank ever needs a whole table.
    budget: a :class:`~course_utils.sharding.budget.MemoryBudget`, checked before
        anything is allocated (``extra_values``: other parameters this rank holds).
    device: where the values live (weights, pooled vectors): this rank's device by default, or
        ``"meta"`` to price real sizes on a modeled cluster without holding them (the ids stay
        real, on this rank's device, so that row-wise routing still reads them).
    group: the process group the tables are sharded over (default: all ranks); its size must be
        the plan's ``world_size`` and ranks are its group ranks (2-D sparse parallelism shards
        inside a group of ranks, appendix 07c).
    Must be built inside a process group whose size is the plan's ``world_size``.
    """

    def __init__(
        self,
        plan: ShardingPlan,
        weights=None,
        *,
        seed: int = 0,
        budget=None,
        extra_values: int = 0,
        device=None,
        group=None,
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "a sharded lookup lives in a process group: build it inside a function "
                "run by course_utils.launch (or after dist.init_process_group)"
            )
        self.group = group
        self.rank, world = dist.get_rank(group), dist.get_world_size(group)
        if world != plan.world_size:
            raise ValueError(
                f"the plan is for {plan.world_size} ranks but the process group has {world}; "
                f"make the plan with world_size={world}"
            )
        self.plan, self.shards = plan, plan.shards_of(self.rank)
        if budget is not None:  # every rank checks every rank: all refuse together, none waits for the others
            budget.check(plan, extra_values=extra_values)
        self.index_device = rank_device()  # the ids'
        self.device = device = self.index_device if device is None else torch.device(device)
        tables = None if weights is None else full_tables(weights)
        if tables is not None and [tuple(w.shape) for w in tables] != [
            (n, plan.dim) for n in plan.cardinalities
        ]:
            raise ValueError(
                "weights do not match the plan: expected tables of shapes "
                f"{[(n, plan.dim) for n in plan.cardinalities][:4]}..., got "
                f"{[tuple(w.shape) for w in tables][:4]}..."
            )
        self.weights = nn.ParameterList(
            nn.Parameter(self._initial(s, tables, seed).to(device)) for s in self.shards
        )
        self.traffic = Traffic(world, self.rank)

    @torch.no_grad()
    def _initial(self, shard: Shard, tables, seed: int) -> torch.Tensor:
        if self.device.type == "meta":
            return torch.empty(shard.num_rows, shard.num_cols, device="meta")
        if tables is not None:
            return shard.of(tables[shard.table].detach()).clone().cpu()
        gen = torch.Generator().manual_seed(seed * 1_000_003 + shard.table * 1_009 + shard.rank)
        bound = self.plan.cardinalities[shard.table] ** -0.5
        return torch.empty(shard.num_rows, shard.num_cols).uniform_(-bound, bound, generator=gen)

    def _bags(self, ids: torch.Tensor) -> torch.Tensor:
        """Check ``ids`` and return them as ``[B, T, L]`` int64 on this rank's device."""
        check_ids(ids, self.plan.cardinalities, bags=True)
        return (ids.unsqueeze(-1) if ids.dim() == 2 else ids).to(self.index_device)

    def shard_gradients(self) -> list:
        """``[(shard, grad)]`` for this rank's shards (grad None before a backward pass)."""
        return [(s, w.grad) for s, w in zip(self.shards, self.weights, strict=False)]

    def extra_repr(self) -> str:
        return (
            f"{self.plan.kind}, rank {self.rank} of {self.plan.world_size}, "
            f"{len(self.shards)} shard(s), {sum(w.numel() for w in self.weights):,} values"
        )
