"""Row-wise sharding: every rank holds a slice of the rows of every table.

An id's rows live on one rank only (its *owner*: ``id // ceil(N / W)`` for a range
split, ``id % W`` for a hash split), so each id travels to its owner, and each owner
returns *partial* sums: for every bag of every rank, the sum of the rows it holds.
Forward on rank ``r`` with its batch ``ids [B, T, L]``:

1. **counts out**: tell each rank how many ids it will get from us (one int64 each);
2. **ids out**: send each owner the pairs ``(bag, local row)`` of its ids, where
   ``bag = t * B + b`` names table ``t``, row ``b`` of our batch;
3. the owner sums its rows per bag into a zero ``[T, B, D]`` for each source rank;
4. **partial sums back**: send each rank its ``[T, B, D]``; add the ``W`` partials up
   (an all-to-all plus a local sum: a reduce-scatter, done by hand).

The ids that travel depend on the data: a range split sends every hot id (a Zipf
distribution's small ids) to rank 0, a hash split spreads them out.

Taught in chapter 07 (section 5, row-wise).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from course_utils.sharding.alltoall import exchange
from course_utils.sharding.base import ShardedEmbeddingBags
from course_utils.sharding.plan import ShardingPlan

__all__ = ["RowWiseEmbeddingBags", "route"]


def route(plan: ShardingPlan, bags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Owner rank and row within the owner's shard of every id: ``bags [B, T, L]`` ->
    two ``[B, T, L]`` int64 tensors (all tables at once)."""
    W = plan.world_size
    if plan.row_split == "hash":
        return bags % W, bags // W
    block = torch.tensor([-(-n // W) for n in plan.cardinalities], device=bags.device).view(1, -1, 1)
    owner = bags // block
    return owner, bags - owner * block


class RowWiseEmbeddingBags(ShardedEmbeddingBags):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]``; this rank holds rows of every table."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bags = self._bags(ids)
        B, T, L = bags.shape
        W, D = self.plan.world_size, self.plan.dim
        owner, local = route(self.plan, bags)
        bag = (
            torch.arange(T, device=bags.device).view(1, T, 1) * B
            + torch.arange(B, device=bags.device).view(B, 1, 1)
        ).expand(B, T, L)
        by_owner = owner.flatten().argsort(stable=True)
        pairs = torch.stack([bag.flatten(), local.flatten()], dim=1)[by_owner]  # [B*T*L, 2]
        counts = torch.bincount(owner.flatten(), minlength=W)  # [W]
        incoming = exchange(list(counts.split(1)), [(1,)] * W, "counts", self.traffic, self.group)  # 1.
        n_in = [int(c) for c in incoming]
        got = exchange(
            list(pairs.split(counts.tolist())), [(n, 2) for n in n_in], "ids", self.traffic, self.group
        )  # 2.
        source = torch.cat([torch.full((n,), s, device=bags.device) for s, n in enumerate(n_in)])
        got = torch.cat(got)
        slot, rows = source * T * B + got[:, 0], got[:, 1]  # where each sum goes
        table = got[:, 0] // B  # 3. grouped by table (shard t = table t), in arrival order
        by_table = table.argsort(stable=True)
        per_table = rows[by_table].split(torch.bincount(table, minlength=T).tolist())
        vectors = torch.cat(
            [F.embedding(r.to(w.device), w) for r, w in zip(per_table, self.weights, strict=True)]
        )
        partial = torch.zeros(W * T * B, D, device=self.device)
        partial = partial.index_add(0, slot[by_table].to(self.device), vectors)
        back = exchange(
            list(partial.view(W, T, B, D).unbind(0)), [(T, B, D)] * W, "embeddings", self.traffic, self.group
        )  # 4.
        return torch.stack(back).sum(0).transpose(0, 1)  # [B, T, D]
