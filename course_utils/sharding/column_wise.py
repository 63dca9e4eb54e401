"""Column-wise sharding: every rank holds a block of columns of every table.

Forward on rank ``r`` with its batch ``ids [B, T, L]``:

1. **ids out**: every rank needs every id (its columns of every row): send the whole
   ``[B, T, L]`` to each rank;
2. each rank looks up its columns for all ``W`` batches, ``[W * B, T, D_s]``;
3. **pooled embeddings back**: send each rank its ``[B, T, D_s]``; concatenate the
   column blocks in rank order to get ``[B, T, D]``.

More ids travel than table-wise (``W`` times), the same number of embedding bytes, and
every rank does an equal share of the lookups whatever the table sizes.

Taught in chapter 07 (section 6, column-wise).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from course_utils.sharding.alltoall import exchange
from course_utils.sharding.base import ShardedEmbeddingBags

__all__ = ["ColumnWiseEmbeddingBags"]


class ColumnWiseEmbeddingBags(ShardedEmbeddingBags):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]``; this rank holds columns of every table."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bags = self._bags(ids)
        B, T, L = bags.shape
        W = self.plan.world_size
        got = exchange([bags] * W, [(B, T, L)] * W, "ids", self.traffic, self.group)  # 1. ids out
        every_batch = torch.cat(got)  # [W * B, T, L]
        pooled = torch.stack(
            [
                F.embedding_bag(every_batch[:, t].to(w.device), w, mode="sum")  # 2. look up
                for t, w in enumerate(self.weights)
            ],
            dim=1,
        )  # [W * B, T, D_mine]
        widths = [self.plan.shards_of(s)[0].num_cols for s in range(W)]
        back = exchange(
            list(pooled.split(B)),
            [(B, T, widths[s]) for s in range(W)],
            "embeddings",
            self.traffic,
            self.group,
        )  # 3. pooled back
        return torch.cat(back, dim=2)
