"""The sharded lookup for a plan: ``shard_embeddings(plan)`` picks the class for ``plan.kind``.

Taught in chapter 07 (section 7, each sharded lookup against the unsharded one).
"""

from __future__ import annotations

from .base import ShardedEmbeddingBags
from .column_wise import ColumnWiseEmbeddingBags
from .plan import ShardingPlan
from .row_wise import RowWiseEmbeddingBags
from .table_wise import TableWiseEmbeddingBags

__all__ = ["LOOKUPS", "shard_embeddings"]

LOOKUPS = {
    "table_wise": TableWiseEmbeddingBags,
    "row_wise": RowWiseEmbeddingBags,
    "column_wise": ColumnWiseEmbeddingBags,
}


def shard_embeddings(plan: ShardingPlan, weights=None, **options) -> ShardedEmbeddingBags:
    """The sharded lookup for ``plan.kind``, holding this rank's shards (see ShardedEmbeddingBags)."""
    return LOOKUPS[plan.kind](plan, weights, **options)
