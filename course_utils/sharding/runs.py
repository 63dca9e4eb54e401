"""Time sharded lookups inside a rank: forward + backward steps on synthetic click-log ids.

* ``modeled_lookup_step``: one step on a modeled cluster (``launch(..., cluster=...)``), the values
  on the meta device: real table sizes priced in virtual time, the ids real;
* ``time_lookup_steps``: several steps timed with ``timing.now()`` (the modeled clock under a
  cluster, else this machine's).

Taught in chapter 07 (appendix 07f, section 2: the three schemes' step times).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils.runtime import cluster
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.timing import now, synchronize
from course_utils.sharding.lookups import shard_embeddings
from course_utils.sharding.plan import make_plan
from course_utils.sharding.volume import routed_ids
from course_utils.workload import data

__all__ = ["time_lookup_steps", "modeled_lookup_step"]


def _lookup_and_ids(kind, options, cardinalities, dim, batch, steps, device):
    """This rank's sharded lookup and every rank's ids ``[step, rank, batch, T]`` (Zipf, seed 0)."""
    world = dist.get_world_size()
    logs = data.make_click_logs(batch * world * steps, seed=0, cardinalities=cardinalities, n_dense=1)
    plan = make_plan(kind, cardinalities, dim, world, **options)
    ids = torch.from_numpy(logs.sparse).view(steps, world, batch, -1)
    return plan, shard_embeddings(plan, seed=0, device=device), ids


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
    ``device``: where the values live (``"meta"`` on a modeled cluster: real sizes, priced only).

    Returns this rank's step times in seconds (``steps`` of them), the bytes it sent in the
    last step (``Traffic.as_dict()``) and, for row-wise plans, the routing of the last step's
    ids (``routed_ids``) that the byte formula needs.
    """
    rank = dist.get_rank()
    plan, lookup, ids = _lookup_and_ids(kind, options, cardinalities, dim, batch, steps + warmup, device)
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


def modeled_lookup_step(kind: str, options: dict, cardinalities, dim: int, batch: int) -> dict:
    """Run in every rank of a modeled cluster: one forward + backward of the sharded lookup on this
    rank's ``batch`` rows of synthetic ids, the tables and vectors on the meta device.

    Returns ``{"step_ns"`` (barrier to barrier: the slowest rank's step), ``"traffic"`` (bytes this
    rank sent, ``Traffic.as_dict()``), ``"routed"`` (row-wise: ``routed_ids``, else None),
    ``"timeline"`` (this rank's ``ClusterTimeline`` of the step)``}``.
    """
    rank = dist.get_rank()
    plan, lookup, ids = _lookup_and_ids(kind, options, cardinalities, dim, batch, 1, "meta")
    dist.barrier()
    start = cluster.modeled_ns()
    lookup(ids[0, rank]).sum().backward()
    dist.barrier()
    end = cluster.modeled_ns()
    return {
        "step_ns": end - start,
        "traffic": lookup.traffic.as_dict(),
        "routed": routed_ids(plan, list(ids[0])) if kind == "row_wise" else None,
        "timeline": cluster.timeline().window(start, end),
    }
