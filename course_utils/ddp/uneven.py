"""Uneven inputs: ranks with different numbers of batches, with and without ``Join``.

Every backward of a DDP model ends in an all-reduce that *all* ranks must call. A rank that
runs out of batches first stops calling it, and the others wait for it in their next
backward: without help, forever (until the process group's timeout). PyTorch's answer is
the context manager ``torch.distributed.algorithms.join.Join``::

    with Join([ddp_model]):
        for batch in my_batches:          # as many as this rank has
            loss(ddp_model(batch)).backward(); optimizer.step()

A rank that has finished its loop stays inside ``Join`` and *shadows* the collectives the
others still run: it joins each of their all-reduces with zero gradients (and DDP divides
by the number of ranks still training), until every rank is done.

Taught in chapter 04 (appendix 04a, section 6: uneven inputs).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

__all__ = ["train_uneven"]


def train_uneven(batches_per_rank: list[int], use_join: bool, group_timeout_s: float = 5.0) -> dict:
    """Train a tiny linear model with torch DDP, rank ``r`` taking ``batches_per_rank[r]`` steps.

    Call on every rank under ``launch(..., init_group=False)``: it starts the gloo group itself,
    with ``group_timeout_s``, so that a rank left waiting in an all-reduce raises after that
    many seconds instead of hanging. Batches: ``[8, 4]`` random rows, targets ``[8, 1]``.
    Returns ``{"rank", "steps", "weight"}`` (the final weight, ``[1, 4]``).
    """
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=group_timeout_s))
    rank = dist.get_rank()
    if len(batches_per_rank) != dist.get_world_size():
        raise ValueError(
            f"batches_per_rank has {len(batches_per_rank)} entries for {dist.get_world_size()} ranks"
        )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    batches = [
        (torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator))
        for _ in range(batches_per_rank[rank])
    ]

    def loop() -> int:
        steps = 0
        for x, y in batches:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()  # DDP's all-reduce runs in here
            optimizer.step()
            steps += 1
        return steps

    if use_join:
        with Join([model]):
            steps = loop()
    else:
        steps = loop()
    return {"rank": rank, "steps": steps, "weight": model.module.weight.detach().clone()}
