"""The sharded lookup for a plan: ``shard_embeddings(plan)`` picks the class for ``plan.kind``.

Taught in chapter 07 (section 7, each sharded lookup against the unsharded one).
"""

from __future__ import annotations

from course_utils.sharding.base import ShardedEmbeddingBags
from course_utils.sharding.column_wise import ColumnWiseEmbeddingBags
from course_utils.sharding.plan import ShardingPlan
from course_utils.sharding.row_wise import RowWiseEmbeddingBags
from course_utils.sharding.table_wise import TableWiseEmbeddingBags

__all__ = ["LOOKUPS", "shard_embeddings"]

LOOKUPS = {
    "table_wise": TableWiseEmbeddingBags,
    "row_wise": RowWiseEmbeddingBags,
    "column_wise": ColumnWiseEmbeddingBags,
}


def shard_embeddings(plan: ShardingPlan, weights=None, **options) -> ShardedEmbeddingBags:
    """The sharded lookup for ``plan.kind``, holding this rank's shards (see ShardedEmbeddingBags)."""
    return LOOKUPS[plan.kind](plan, weights, **options)
