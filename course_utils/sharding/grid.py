"""Grid sharding: each table's columns cut into blocks placed on different hosts, each block's rows
cut over its host's ranks.

TorchRec's ``ShardingType.GRID_SHARD`` ("each rank gets a subset of columns and rows in a CW and
TWRW style", ``torchrec/distributed/types.py``); its ``GridPooledEmbeddingSharding``
(``torchrec/distributed/sharding/grid_sharding.py``) treats each column shard "on a per node basis":
a column block is a table-row-wise piece. So is it here: a grid plan is a table-row-wise plan of
``T x C`` pieces (table ``t``, column block ``c`` of ``D / C`` columns), and the lookup is
:class:`~course_utils.sharding.table_row_wise.TableRowWiseEmbeddingBags`, which puts the blocks
side by side again. Compared with table-row-wise, one table's lookups (and memory) spread over
``C`` hosts instead of one; every id now travels to ``C`` hosts.

Taught in chapter 07 (appendix 07c, sharding at scale).
"""

from __future__ import annotations

from collections.abc import Sequence

from course_utils.sharding.plan import PLANNERS
from course_utils.sharding.table_row_wise import (
    HostShardingPlan,
    TableRowWiseEmbeddingBags,
    plan_pieces_on_hosts,
)

__all__ = ["plan_grid", "GridEmbeddingBags"]


def plan_grid(
    cardinalities: Sequence[int],
    dim: int,
    world_size: int,
    ranks_per_host: int,
    column_blocks: int | None = None,
) -> HostShardingPlan:
    """Each table cut into ``column_blocks`` blocks of ``dim / column_blocks`` columns (default: one
    per host), the blocks placed on hosts largest first, each block's rows cut over its host."""
    hosts = world_size // ranks_per_host if ranks_per_host else 0
    blocks = hosts if column_blocks is None else column_blocks
    return plan_pieces_on_hosts("grid_shard", cardinalities, dim, world_size, ranks_per_host, blocks)


PLANNERS["grid_shard"] = plan_grid


class GridEmbeddingBags(TableRowWiseEmbeddingBags):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]`` for a grid plan (:func:`plan_grid`)."""
