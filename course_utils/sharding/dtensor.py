"""A sharded lookup's shards as DTensors: each rank's piece, with its place in the whole table.

``torch.distributed.checkpoint`` (DCP) saves a tensor split over ranks as a DTensor: the
local piece plus where it sits in the whole (``Shard(0)``: the ranks' pieces stacked along
the rows; ``Shard(1)``: along the columns). ``as_dtensor`` describes one shard of a
``ShardedEmbeddingBags`` that way, and ``checkpoint_entries`` lists a lookup's shards,
named by their table, in the form ``course_utils.checkpoint.save_sharded`` takes.

Taught in chapter 08 (section 3, sharded state).
"""

from __future__ import annotations

import functools
import weakref

import torch

__all__ = ["as_dtensor", "device_mesh", "checkpoint_entries"]

_MESHES = weakref.WeakKeyDictionary()  # one device mesh per lookup: all its ranks, in order


def as_dtensor(bags, index: int, local: torch.Tensor):
    """Shard ``index`` of this rank (``bags.shards[index]``; ``local``: its weight, or a tensor
    shaped like it) as what DCP should save: a DTensor that knows its place in the whole table
    (row-wise range: ``Shard(0)``, column-wise: ``Shard(1)``), or the whole table itself
    (table-wise: only its owner has the key)."""
    from torch.distributed.tensor import DTensor, Shard

    plan = bags.plan
    if plan.kind == "table_wise":
        return local
    if plan.kind == "row_wise" and plan.row_split == "hash":
        raise ValueError(
            "a hash (modulo) row split gives each rank every W-th row, which DTensor cannot "
            "describe (its shards are contiguous blocks); checkpoint a range-split plan"
        )
    shape = (plan.cardinalities[bags.shards[index].table], plan.dim)
    placement = Shard(0 if plan.kind == "row_wise" else 1)
    return DTensor.from_local(
        local,
        device_mesh(bags, local.device.type),
        [placement],
        run_check=False,
        shape=shape,
        stride=(plan.dim, 1),
    )


def device_mesh(bags, device_type: str):
    """The device mesh of ``bags``'s ranks (all of them, in order), made once per lookup."""
    from torch.distributed.device_mesh import init_device_mesh

    if bags not in _MESHES:
        _MESHES[bags] = init_device_mesh(device_type, (bags.plan.world_size,))
    return _MESHES[bags]


def checkpoint_entries(bags, prefix: str = "embeddings") -> list:
    """``[(name, weight, place)]`` for this rank's shards of ``bags`` (a ``ShardedEmbeddingBags``):
    each named by its table (``<prefix>.table3``, the same on every rank and in every plan), with
    ``place`` turning the shard (or optimizer state shaped like it) into its DTensor."""
    return [
        (f"{prefix}.table{shard.table}", weight, functools.partial(as_dtensor, bags, i))
        for i, (shard, weight) in enumerate(zip(bags.shards, bags.weights, strict=False))
    ]
