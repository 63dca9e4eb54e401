"""A sharded model made whole on one rank, and a fingerprint of it that ignores the layout.

``gather_tables`` sends every rank's shards to rank 0, which puts each piece back where its
:class:`~course_utils.sharding.plan.Shard` says it belongs (rows ``range(*rows, stride)``,
columns ``range(*cols)``): the whole tables ``[N_t, D]``, as one process would hold them.
``state_sha256`` hashes those tables and the dense layers by name, so two runs whose states
are equal get the same hex digest whatever plan and number of ranks held them: "did the
resumed job end where the uninterrupted one did" becomes a comparison of two strings.

Everything passes through rank 0's memory: fine for checking the course's models, not for a
model whose tables only fit when sharded (there, compare checkpoints with DCP instead).

Taught in chapter 08 (the production job prints ``params sha256 <hex>``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["gather_tables", "state_sha256"]


def gather_tables(bags) -> list[torch.Tensor] | None:
    """On rank 0, the whole tables ``[[N_t, D]]`` of a ``ShardedEmbeddingBags``; None on the
    other ranks. Every rank of the lookup's group calls it."""
    mine = [(shard, weight.detach().cpu()) for shard, weight in zip(bags.shards, bags.weights, strict=True)]
    pieces = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, pieces, dst=0)
    if dist.get_rank() != 0:
        return None
    plan = bags.plan
    tables = [torch.zeros(n, plan.dim) for n in plan.cardinalities]
    for shard, weight in (piece for rank_pieces in pieces for piece in rank_pieces):
        rows = slice(shard.rows[0], shard.rows[1], shard.stride)
        tables[shard.table][rows, shard.cols[0] : shard.cols[1]] = weight
    return tables


def state_sha256(model) -> str | None:
    """The sha256 hex digest of a ``HybridDLRM``'s whole parameters (tables gathered, dense
    layers as rank 0 holds them), taken in name order over each tensor's name, shape and
    float32 bytes. On rank 0; None on the others. Every rank calls it."""
    tables = gather_tables(model.embeddings)
    if tables is None:
        return None
    named = {f"embeddings.table{t}": w for t, w in enumerate(tables)}
    named.update({f"dense.{n}": p.detach().cpu() for n, p in model.dense.module.named_parameters()})
    digest = hashlib.sha256()
    for name in sorted(named):
        values = np.ascontiguousarray(named[name].to(torch.float32).numpy())
        digest.update(f"{name}{tuple(values.shape)}".encode())
        digest.update(values.tobytes())
    return digest.hexdigest()
