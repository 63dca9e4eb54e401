"""The sharded lookup for a plan: ``shard_embeddings(plan)`` picks the class for ``plan.kind``.

Taught in chapter 07 (section 7, each sharded lookup against the unsharded one).
"""

from __future__ import annotations

from course_utils.sharding.base import ShardedEmbeddingBags
from course_utils.sharding.column_wise import ColumnWiseEmbeddingBags
from course_utils.sharding.grid import GridEmbeddingBags
from course_utils.sharding.plan import ShardingPlan
from course_utils.sharding.replicated_tables import ReplicatedEmbeddingBags
from course_utils.sharding.row_wise import RowWiseEmbeddingBags
from course_utils.sharding.table_row_wise import TableRowWiseEmbeddingBags
from course_utils.sharding.table_wise import TableWiseEmbeddingBags

__all__ = ["LOOKUPS", "shard_embeddings"]

LOOKUPS = {
    "table_wise": TableWiseEmbeddingBags,
    "row_wise": RowWiseEmbeddingBags,
    "column_wise": ColumnWiseEmbeddingBags,
    "table_row_wise": TableRowWiseEmbeddingBags,  # appendix 07c
    "grid_shard": GridEmbeddingBags,
    "data_parallel": ReplicatedEmbeddingBags,
}


def shard_embeddings(plan: ShardingPlan, weights=None, **options) -> ShardedEmbeddingBags:
    """The sharded lookup for ``plan.kind``, holding this rank's shards (see ShardedEmbeddingBags)."""
    return LOOKUPS[plan.kind](plan, weights, **options)
