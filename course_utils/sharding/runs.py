"""Time sharded lookups inside a rank: forward + backward steps on synthetic click-log ids.

Taught in chapter 07 (section 9, skew: where the ids land).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils.runtime.hardware import rank_device
from course_utils.runtime.timing import now, synchronize
from course_utils.sharding.lookups import shard_embeddings
from course_utils.sharding.plan import make_plan
from course_utils.sharding.volume import routed_ids
from course_utils.workload import data

__all__ = ["time_lookup_steps"]


def time_lookup_steps(
    kind: str,
    options: dict,
    cardinalities,
    dim: int,
    batch: int,
    steps: int,
    warmup: int = 2,
    device=None,
) -> tuple[list[float], dict, list | None]:
    """Run in every rank: ``warmup + steps`` forward + backward passes of the sharded lookup on
    each rank's own ``batch`` rows of synthetic (Zipf) ids, each step between two barriers.

    Returns this rank's step times in seconds (``steps`` of them), the bytes it sent in the
    last step (``Traffic.as_dict()``) and, for row-wise plans, the routing of the last step's
    ids (``routed_ids``) that the byte formula needs.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    logs = data.make_click_logs(
        batch * world * (steps + warmup), seed=0, cardinalities=cardinalities, n_dense=1
    )
    plan = make_plan(kind, cardinalities, dim, world, **options)
    lookup = shard_embeddings(plan, seed=0, device=device)
    ids = torch.from_numpy(logs.sparse).view(steps + warmup, world, batch, -1)  # [step, rank, B, T]
    gpu, seconds = rank_device(), []
    for step in range(steps + warmup):
        lookup.traffic.reset()
        lookup.zero_grad(set_to_none=True)
        dist.barrier()
        synchronize(gpu)
        start = now()
        lookup(ids[step, rank]).sum().backward()
        synchronize(gpu)  # the GPU's work done, not only queued (a barrier waits on the CPU, in gloo)
        dist.barrier()
        if step >= warmup:
            seconds.append(now() - start)
    routed = routed_ids(plan, list(ids[-1])) if kind == "row_wise" else None
    return seconds, lookup.traffic.as_dict(), routed
