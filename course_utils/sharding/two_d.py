"""2-D sparse parallelism: tables sharded inside a group of ranks, the groups replicas of each other.

``W = R * G`` ranks form ``R`` *sharding groups* of ``G`` ranks. Each group holds a whole copy of
the tables, sharded over its ``G`` ranks by one of chapter 07's plans, and looks up its own ranks'
batches with all-to-alls inside the group. Rank ``i`` of every group holds the same shards: those
``R`` ranks form a *replica group*, and they keep their shards equal by averaging, over the replica
group, either

* the shards' **gradients**, every step, before the optimizer (``sync("gradients")``): with every
  rank's loss the mean over its group's batch, the average is the gradient of the mean over all
  ``W`` batches, so training equals one process on the global batch;
* or the shards' **weights**, every ``k`` steps, after the optimizer (``sync("weights")``), as
  TorchRec's ``DMPCollection.sync()`` does (``allreduce_coalesced`` with ``ReduceOp.AVG`` on the
  replica group, weights and optimizer state, ``torchrec/distributed/model_parallel.py``). With plain
  SGD and ``k = 1`` this too equals one process; with ``k > 1`` the replicas drift apart in between
  (local SGD).

The layout (``layout``): ``"contiguous"`` groups are hosts (ranks ``[g G, (g + 1) G)``): the lookups'
all-to-alls stay inside a host and the replicas' all-reduce crosses hosts (TorchRec's
``use_inter_host_allreduce=True``); ``"strided"`` groups take every ``R``-th rank, so that a shard's
replicas sit in one host (TorchRec's default: "its replicated shards lie on the ranks within the
node", ``DMPCollection._create_process_groups``).

Taught in chapter 07 (appendix 07c, sharding at scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from course_utils.sharding.alltoall import Traffic
from course_utils.sharding.base import lookup_unsharded
from course_utils.sharding.lookups import shard_embeddings
from course_utils.sharding.plan import make_plan
from course_utils.sharding.replicated_tables import all_reduce_by_exchange
from course_utils.sharding.table_row_wise import GroupTraffic, rank_groups

__all__ = ["TwoDEmbeddingBags", "two_d_groups", "train_two_d", "train_one_process", "LAYOUTS"]

LAYOUTS = ("contiguous", "strided")


def two_d_groups(group_size: int, layout: str = "contiguous") -> tuple:
    """This rank's ``(sharding group, its ranks)`` and ``(replica group, its ranks)``; every rank
    calls it together."""
    world = dist.get_world_size()
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if group_size < 1 or world % group_size:
        raise ValueError(f"group_size {group_size} must divide the {world} ranks into equal sharding groups")
    if layout == "contiguous":
        groups = rank_groups(group_size)
        return groups["block"], groups["stride"]
    groups = rank_groups(world // group_size)
    return groups["stride"], groups["block"]


class TwoDEmbeddingBags(nn.Module):
    """``forward(ids [B, T] or [B, T, L]) -> [B, T, D]``: chapter 07's lookup of ``kind`` over this
    rank's sharding group of ``group_size`` ranks (``plan``: that group's plan).

    weights: the unsharded tables (every group copies its shards from them), or None (each shard
    initialised from ``seed``, the same in every replica). ``traffic()``: bytes this rank sent.
    """

    def __init__(
        self,
        kind: str,
        cardinalities,
        dim: int,
        group_size: int,
        weights=None,
        *,
        layout="contiguous",
        seed: int = 0,
        **plan_options,
    ):
        super().__init__()
        (shard_group, shard_ranks), (replica_group, replica_ranks) = two_d_groups(group_size, layout)
        self.replica_group, self.replicas = replica_group, len(replica_ranks)
        self.plan = make_plan(kind, cardinalities, dim, group_size, **plan_options)
        self.lookup = shard_embeddings(self.plan, weights, seed=seed, group=shard_group)
        world, rank = dist.get_world_size(), dist.get_rank()
        self.lookups_traffic, self.replicas_traffic = Traffic(world, rank), Traffic(world, rank)
        self.lookup.traffic = GroupTraffic(self.lookups_traffic, shard_ranks)
        self.sync_traffic = GroupTraffic(self.replicas_traffic, replica_ranks)  # booked as "gradients"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(ids)

    def traffic(self) -> dict:
        """Bytes this rank sent, by global destination: chapter 07's phases inside the sharding
        group, and ``"sync"``: the replicas' all-reduce."""
        return {**self.lookups_traffic.as_dict(), "sync": self.replicas_traffic.as_dict()["gradients"]}

    def reset_traffic(self) -> None:
        self.lookups_traffic.reset()
        self.replicas_traffic.reset()

    def shard_gradients(self) -> list:
        return self.lookup.shard_gradients()

    @torch.no_grad()
    def sync(self, what: str = "gradients") -> None:
        """Average this rank's shards' ``"gradients"`` or ``"weights"`` over its replica group (one
        all-reduce of all of them together)."""
        if what not in ("gradients", "weights"):
            raise ValueError(f"sync what='gradients' or 'weights', got {what!r}")
        weights = list(self.lookup.weights)
        if what == "gradients":
            values = [w.grad if w.grad is not None else torch.zeros_like(w) for w in weights]
        else:
            values = [w.detach() for w in weights]
        flat = torch.cat([v.reshape(-1) for v in values]) if values else torch.zeros(0)
        total = all_reduce_by_exchange(flat, self.sync_traffic, "gradients", self.replica_group)
        mean = total / self.replicas
        for w, part in zip(weights, mean.split([v.numel() for v in values]), strict=True):
            target = w if what == "weights" else w.grad
            if target is None:
                w.grad = part.view_as(w).clone()
            else:
                target.copy_(part.view_as(w))


def _step_data(logs, step: int, world: int, batch: int):
    rows = slice(step * world * batch, (step + 1) * world * batch)
    return torch.from_numpy(logs.sparse[rows]), torch.from_numpy(logs.label[rows])


def _loss(pooled: torch.Tensor, labels: torch.Tensor, readout: torch.Tensor, mean_over: int):
    """A click model on the tables alone: logit = sum over tables of ``pooled . readout``; the
    summed BCE over ``mean_over`` rows (the rows the loss averages over)."""
    logits = (pooled * readout).sum((1, 2))
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / mean_over


def train_two_d(
    kind: str,
    tables: Sequence[torch.Tensor],
    logs,
    readout,
    *,
    group_size: int,
    batch: int,
    steps: int,
    lr: float,
    sync: str = "gradients",
    every: int = 1,
    layout: str = "contiguous",
    **plan_options,
) -> dict:
    """Run in every rank: ``steps`` SGD steps of 2-D sparse parallelism on ``logs`` (rank ``r`` reads
    rows ``r * batch ..`` of each step's ``W * batch``), the tables starting from ``tables``.
    ``sync``: ``"gradients"`` every step, or ``"weights"`` every ``every`` steps (and after the last).

    Returns ``{"shards": [(Shard, weight [rows, cols])], "traffic": bytes sent in the last step
    (``Traffic.as_dict()``), "sync_values": values per rank in one sync}``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = TwoDEmbeddingBags(
        kind,
        [t.shape[0] for t in tables],
        tables[0].shape[1],
        group_size,
        tables,
        layout=layout,
        **plan_options,
    )
    group_rank = model.lookup.rank
    for step in range(steps):
        model.reset_traffic()
        ids, labels = _step_data(logs, step, world, batch)
        mine = slice(rank * batch, (rank + 1) * batch)
        model.lookup.zero_grad(set_to_none=True)
        _loss(model(ids[mine]), labels[mine], readout, group_size * batch).backward()
        if sync == "gradients":
            model.sync("gradients")
        with torch.no_grad():
            for w in model.lookup.weights:
                if w.grad is not None:
                    w -= lr * w.grad
        if sync == "weights" and ((step + 1) % every == 0 or step == steps - 1):
            model.sync("weights")
    return {
        "shards": [
            (s, w.detach().clone())
            for s, w in zip(model.plan.shards_of(group_rank), model.lookup.weights, strict=True)
        ],
        "traffic": model.traffic(),
        "sync_values": sum(w.numel() for w in model.lookup.weights),
    }


def train_one_process(tables, logs, readout, *, world: int, batch: int, steps: int, lr: float) -> list:
    """The reference: the same SGD steps on the whole tables, one process, each step's loss the mean
    over all ``world * batch`` rows. Returns the trained tables ``[N_t, D]``."""
    full = [t.clone().requires_grad_(True) for t in tables]
    for step in range(steps):
        ids, labels = _step_data(logs, step, world, batch)
        _loss(lookup_unsharded(full, ids), labels, readout, world * batch).backward()
        with torch.no_grad():
            for w in full:
                w -= lr * w.grad
                w.grad = None
    return [w.detach() for w in full]
