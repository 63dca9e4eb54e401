"""Data-parallel (replicated) tables: every rank holds every table whole; gradients all-reduced.

TorchRec's ``ShardingType.DATA_PARALLEL`` ("replicated on all ranks", ``torchrec/distributed/
types.py``): its input and output distributions are no-ops (``DpSparseFeaturesDist``,
``DpPooledEmbeddingDist`` in ``torchrec/distributed/sharding/dp_sharding.py``), and the tables'
gradients are all-reduced with the dense part by DDP: ``sharded_parameter_names`` yields none of
a data-parallel table's (``torchrec/distributed/embeddingbag.py``), so
``DefaultDataParallelWrapper`` (``torchrec/distributed/model_parallel.py``) leaves them to DDP.
Nothing moves in the forward pass; the backward pass moves the whole tables' gradients, whatever
the batch: worth it for small tables only.

The all-reduce here is built from the course's metered all-to-all (:func:`all_reduce_by_exchange`:
a reduce-scatter then an all-gather, each one ``exchange``), so its bytes are counted from the
tensors sent: ``2 (W - 1) n`` values over all ranks for ``n`` values, what a ring all-reduce sends.
Gradients are summed over ranks, as every sharded lookup's are (DDP's average is this over ``W``).

Taught in chapter 07 (appendix 07c, sharding at scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn import functional as F

from course_utils.sharding.alltoall import exchange
from course_utils.sharding.base import ShardedEmbeddingBags
from course_utils.sharding.plan import PLANNERS, Shard, ShardingPlan, _check

__all__ = ["plan_data_parallel", "all_reduce_by_exchange", "chunk_sizes", "ReplicatedEmbeddingBags"]


def plan_data_parallel(cardinalities: Sequence[int], dim: int, world_size: int) -> ShardingPlan:
    """Every table whole on every rank."""
    cards = _check(cardinalities, dim, world_size)
    shards = [Shard(t, r, (0, n), (0, dim)) for r in range(world_size) for t, n in enumerate(cards)]
    return ShardingPlan("data_parallel", cards, dim, world_size, tuple(shards))


PLANNERS["data_parallel"] = plan_data_parallel


def chunk_sizes(n: int, world: int) -> list[int]:
    """How ``torch.tensor_split`` cuts ``n`` values into ``world`` chunks (the first ``n % world``
    one longer): chunk ``r`` is what rank ``r`` reduces."""
    return [n // world + (r < n % world) for r in range(world)]


def all_reduce_by_exchange(tensor: torch.Tensor, traffic=None, phase: str = "gradients", group=None):
    """The sum of ``tensor`` over the ranks of ``group``, on every rank (bit-identical on all).

    1. reduce-scatter: send chunk ``d`` of the flattened tensor to rank ``d``; add what arrives
       (in rank order);
    2. all-gather: send the reduced chunk to every rank; put the chunks together.
    Each rank sends ``(W - 1) / W`` of the tensor in each step (``traffic``, under ``phase``).
    """
    world, me = dist.get_world_size(group), dist.get_rank(group)
    flat = tensor.reshape(-1)
    sizes = chunk_sizes(flat.numel(), world)
    got = exchange(list(flat.split(sizes)), [(sizes[me],)] * world, phase, traffic, group)
    reduced = torch.stack(got).sum(0)
    gathered = exchange([reduced] * world, [(n,) for n in sizes], phase, traffic, group)
    return torch.cat(gathered).view_as(tensor)


class _SumGradients(torch.autograd.Function):
    """Identity on the tables forward; backward all-reduces all their gradients at once (one
    coalesced all-reduce, as DDP's buckets do)."""

    @staticmethod
    def forward(ctx, lookup, *weights):
        ctx.lookup = lookup
        return tuple(w.view_as(w) for w in weights)

    @staticmethod
    def backward(ctx, *grads):
        sizes = [g.numel() for g in grads]
        flat = torch.cat([g.reshape(-1) for g in grads])
        summed = all_reduce_by_exchange(flat, ctx.lookup.traffic, "gradients", ctx.lookup.group)
        return (None, *(s.view_as(g) for s, g in zip(summed.split(sizes), grads, strict=True)))


class ReplicatedEmbeddingBags(ShardedEmbeddingBags):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]``, looked up locally in this rank's copy of
    every table; backward leaves in each table's ``.grad`` the sum over all ranks' batches."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bags = self._bags(ids)
        tables = _SumGradients.apply(self, *self.weights) if torch.is_grad_enabled() else tuple(self.weights)
        return torch.stack(
            [F.embedding_bag(bags[:, t].to(w.device), w, mode="sum") for t, w in enumerate(tables)], dim=1
        )
