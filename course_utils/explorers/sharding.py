"""Sharding explorer: bytes each rank sends per step and memory each rank holds, by sharding type.

For ``tables`` equal tables of ``rows`` x ``dim`` float32 values, a batch of ``batch`` rows per
rank with ``pooling`` ids per bag, on ``world_size`` ranks, ``sharding_view`` gives:

- bytes per rank per step, by phase (ids out, pooled embeddings back, their gradients in the
  backward), from chapter 07's ``sharding.volume.formula`` (row-wise: ids spread evenly over
  the ranks' rows, as a uniform or hashed id distribution gives);
- training memory per rank: the plan's table bytes x (weight + gradient + optimizer copies),
  from ``sharding.plan`` and ``sharding.budget``;
- whether every rank fits a per-rank budget.

Taught in chapter 07 (the explorer).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.sharding.budget import MemoryBudget
from course_utils.sharding.plan import SHARDING_KINDS, make_plan
from course_utils.sharding.volume import formula

__all__ = ["ShardingView", "sharding_view", "draw_sharding", "CONTROLS"]

GIB = 2**30

CONTROLS = {
    "kind": list(SHARDING_KINDS),
    "tables": (1, 64, 1, 8),
    "rows": (2**10, 2**26, 2**20),  # a power-of-two slider
    "dim": (8, 256, 8, 64),
    "batch": (2**6, 2**16, 2**12),  # a power-of-two slider
    "world_size": (1, 32, 1, 4),
    "budget_gib": (0.25, 80.0, 0.25, 16.0),
}


@dataclass(frozen=True)
class ShardingView:
    """``sent_per_rank``: bytes per rank per step by phase (and ``"total"``), averaged over ranks;
    ``memory_per_rank``: training bytes each rank holds; ``fits``: every rank within the budget."""

    kind: str
    sent_per_rank: dict
    memory_per_rank: list[int]
    budget_bytes: int
    fits: bool


def sharding_view(
    kind: str = "table_wise",
    tables: int = 8,
    rows: int = 2**20,
    dim: int = 64,
    batch: int = 2**12,
    world_size: int = 4,
    budget_gib: float = 16.0,
    pooling: int = 1,
    optimizer: str = "adam",
) -> ShardingView:
    """Traffic and memory per rank for ``tables`` tables of ``rows x dim`` sharded ``kind`` on
    ``world_size`` ranks, each rank looking up ``batch`` bags of ``pooling`` ids per table."""
    plan = make_plan(kind, [rows] * tables, dim, world_size)
    routed = None
    if kind == "row_wise":  # every rank's ids spread evenly over the ranks that own their rows
        per_owner = batch * tables * pooling / world_size
        routed = [[per_owner] * world_size for _ in range(world_size)]
    phases = formula(kind, batch, tables, dim, world_size, pooling=pooling, routed=routed)
    sent = {phase: value / world_size for phase, value in phases.items()}
    budget = MemoryBudget(int(budget_gib * GIB), optimizer=optimizer)
    memory = budget.need(plan)
    return ShardingView(kind, sent, memory, budget.bytes_per_rank, max(memory) <= budget.bytes_per_rank)


def draw_sharding(**knobs):
    """Two panels: bytes per rank per step for each sharding type (the chosen one solid), and the
    chosen type's training memory per rank against the budget line."""
    import matplotlib.pyplot as plt

    chosen = knobs.get("kind", "table_wise")
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90, layout="constrained")
    for i, kind in enumerate(SHARDING_KINDS):
        view = sharding_view(**{**knobs, "kind": kind})
        bottom = 0.0
        for phase, colour in (("ids", "C0"), ("embeddings", "C1"), ("gradients", "C2")):
            mib = view.sent_per_rank[phase] / 2**20
            left.bar(
                i,
                mib,
                bottom=bottom,
                color=colour,
                alpha=1.0 if kind == chosen else 0.35,
                label=phase if i == 0 else None,
            )
            bottom += mib
    left.set_xticks(range(len(SHARDING_KINDS)), [k.replace("_", "-") for k in SHARDING_KINDS])
    left.set_ylabel("MiB sent per rank per step")
    left.legend(fontsize=8)
    view = sharding_view(**knobs)
    ranks = range(len(view.memory_per_rank))
    right.bar(ranks, [b / GIB for b in view.memory_per_rank], color="C3" if not view.fits else "C4")
    right.axhline(view.budget_bytes / GIB, color="k", ls="--", label="budget per rank")
    right.set_xticks(list(ranks))  # whole ranks, not matplotlib's fractional ticks
    right.set_xlabel("rank")
    right.set_ylabel("GiB of weights + grads + optimizer")
    right.set_title(f"{chosen.replace('_', '-')}: {'fits' if view.fits else 'does NOT fit'}", fontsize=9)
    right.legend(fontsize=8)
    return fig
