"""Embedding sharding by hand: table-wise, row-wise and column-wise lookups over all-to-all.

    from course_utils import sharding
    plan = sharding.make_plan("row_wise", cardinalities, dim=16, world_size=4)
    lookup = sharding.shard_embeddings(plan, weights=dlrm)    # inside a launched rank
    pooled = lookup(ids)                                      # [B, T] -> [B, T, D], as unsharded

Modules: ``plan`` (who owns what), ``alltoall`` (``exchange``: the metered, differentiable
all-to-all), ``table_wise`` / ``row_wise`` / ``column_wise`` (the lookups), ``lookups``
(``shard_embeddings``: the lookup for a plan),
``volume`` (bytes per step: formula and measurement), ``budget`` (a memory budget
per rank, enforced), ``draw`` (the all-to-all pattern as a picture), ``timing``
(step times of a lookup).

Taught in chapter 07.
"""

from .alltoall import Traffic, exchange
from .base import ShardedEmbeddingBags, full_tables, lookup_unsharded
from .budget import BudgetExceededError, MemoryBudget
from .column_wise import ColumnWiseEmbeddingBags
from .draw import draw_pattern
from .lookups import LOOKUPS, shard_embeddings
from .plan import (
    SHARDING_KINDS,
    Shard,
    ShardingPlan,
    make_plan,
    place_largest_first,
    plan_column_wise,
    plan_row_wise,
    plan_table_wise,
)
from .row_wise import RowWiseEmbeddingBags, route
from .table_wise import TableWiseEmbeddingBags
from .timing import time_lookup_steps
from .volume import formula, measured, routed_ids

__all__ = [
    "SHARDING_KINDS",
    "Shard",
    "ShardingPlan",
    "make_plan",
    "place_largest_first",
    "plan_table_wise",
    "plan_row_wise",
    "plan_column_wise",
    "ShardedEmbeddingBags",
    "TableWiseEmbeddingBags",
    "RowWiseEmbeddingBags",
    "ColumnWiseEmbeddingBags",
    "LOOKUPS",
    "shard_embeddings",
    "lookup_unsharded",
    "full_tables",
    "route",
    "Traffic",
    "exchange",
    "formula",
    "measured",
    "routed_ids",
    "MemoryBudget",
    "BudgetExceededError",
    "draw_pattern",
    "time_lookup_steps",
]
