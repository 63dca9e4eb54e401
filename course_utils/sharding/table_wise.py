"""Table-wise sharding: each table whole on one rank.

Forward on rank ``r`` with its batch ``ids [B, T, L]``:

1. **ids out**: send rank ``s`` the columns of the tables ``s`` owns, ``[B, T_s, L]``;
2. the owner looks up all ``W`` batches at once, ``[W * B, T_s, D]``;
3. **pooled embeddings back**: send each rank its ``[B, T_s, D]``; put the tables in order.

Backward: the gradient of each ``[B, T_s, D]`` goes back to its owner (the reverse
all-to-all), which sums the rows it looked up for all ranks into its table's gradient.

Taught in chapter 07 (section 4, table-wise).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from course_utils.sharding.alltoall import exchange
from course_utils.sharding.base import ShardedEmbeddingBags

__all__ = ["TableWiseEmbeddingBags"]


class TableWiseEmbeddingBags(ShardedEmbeddingBags):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]``; this rank holds whole tables."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bags = self._bags(ids)
        B, T, L = bags.shape
        W, D = self.plan.world_size, self.plan.dim
        owned = [self.plan.tables_of(s) for s in range(W)]  # tables of each rank
        got = exchange(
            [bags[:, owned[s]] for s in range(W)],  # 1. ids out
            [(B, len(owned[self.rank]), L)] * W,
            "ids",
            self.traffic,
            self.group,
        )
        every_batch = torch.cat(got)  # [W * B, T_mine, L]
        if len(self.weights):  # 2. look up
            pooled = torch.stack(
                [
                    F.embedding_bag(every_batch[:, j].to(w.device), w, mode="sum")
                    for j, w in enumerate(self.weights)
                ],
                dim=1,
            )
        else:  # no table here: nothing to send, but backward's reverse all-to-all needs this rank too
            pooled = torch.zeros((W * B, 0, D), device=self.device).requires_grad_(torch.is_grad_enabled())
        back = exchange(
            list(pooled.split(B)),  # 3. pooled embeddings back
            [(B, len(owned[s]), D) for s in range(W)],
            "embeddings",
            self.traffic,
            self.group,
        )
        order = [t for s in range(W) for t in owned[s]]  # table of each column of cat(back)
        where = torch.tensor(order).argsort()
        out = torch.cat(back, dim=1)
        return out[:, where.to(out.device)]
