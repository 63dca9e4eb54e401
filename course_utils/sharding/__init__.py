"""Embedding sharding by hand: table-wise, row-wise and column-wise lookups over all-to-all.

    from course_utils import sharding
    plan = sharding.make_plan("row_wise", cardinalities, dim=16, world_size=4)
    lookup = sharding.shard_embeddings(plan, weights=dlrm)    # inside a launched rank
    pooled = lookup(ids)                                      # [B, T] -> [B, T, D], as unsharded

Modules: ``plan`` (who owns what), ``alltoall`` (``exchange``: the metered, differentiable
all-to-all), ``table_wise`` / ``row_wise`` / ``column_wise`` (the lookups), ``lookups``
(``shard_embeddings``: the lookup for a plan),
``volume`` (bytes per step: formula and measurement), ``budget`` (a memory budget
per rank, enforced), ``plot`` (the all-to-all pattern as a picture), ``runs``
(step times of a lookup, on a modeled cluster), ``hybrid`` (the hybrid-parallel DLRM: sharded tables,
DDP dense part), ``mlperf`` (MLPerf's DLRM-DCNv2 on a modeled 8-GPU node, against a published step).
``torchrec_dlrm``, ``torchrec_train`` and ``torchrec_checkpoint`` build, train and checkpoint the same
DLRM with TorchRec (appendix 07a); TorchRec is optional, so they are imported by name, not here.
Appendix 07c: ``table_row_wise``, ``grid``, ``replicated_tables`` (TorchRec's other sharding types,
registered in ``LOOKUPS`` and ``make_plan``), ``two_d`` (2-D sparse parallelism), ``link_bytes``
(bytes between every pair of ranks) and ``scale_runs`` (their price on 2 to 8 modeled hosts).
``cache`` (an LRU cache of hot rows, hit rates against Che's approximation), ``cache_steps`` (its
misses on a modeled GPU's host link) and ``quantized`` (FP16 and INT8 tables) are appendix 07d's,
imported by name.
``hashing`` (raw ids into rows, collisions), ``managed_collisions`` (a frequency-managed id map with
eviction) and ``id_runs`` (what collisions cost in AUC) serve appendix 07e, imported by name.

Taught in chapter 07.
"""

from course_utils.sharding.alltoall import Traffic, exchange
from course_utils.sharding.base import ShardedEmbeddingBags, full_tables, lookup_unsharded
from course_utils.sharding.budget import BudgetExceededError, MemoryBudget
from course_utils.sharding.column_wise import ColumnWiseEmbeddingBags
from course_utils.sharding.lookups import LOOKUPS, shard_embeddings
from course_utils.sharding.plan import (
    AT_SCALE_KINDS,
    SHARDING_KINDS,
    Shard,
    ShardingPlan,
    make_plan,
    plan_column_wise,
    plan_row_wise,
    plan_table_wise,
)
from course_utils.sharding.plot import draw_pattern
from course_utils.sharding.row_wise import RowWiseEmbeddingBags, route
from course_utils.sharding.runs import modeled_lookup_step, time_lookup_steps
from course_utils.sharding.table_wise import TableWiseEmbeddingBags
from course_utils.sharding.volume import busiest_rank_bytes, formula, measured, routed_ids

__all__ = [
    "SHARDING_KINDS",
    "AT_SCALE_KINDS",
    "Shard",
    "ShardingPlan",
    "make_plan",
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
    "busiest_rank_bytes",
    "routed_ids",
    "MemoryBudget",
    "BudgetExceededError",
    "draw_pattern",
    "time_lookup_steps",
    "modeled_lookup_step",
]
