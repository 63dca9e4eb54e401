"""What must be the same on every DDP rank, and what must differ: seeds, dropout, the clipped norm.

* **Initial weights**: the same on every rank. A shared seed gives that, but DDP does not rely
  on it: its constructor broadcasts rank 0's parameters and buffers to the others.
* **Randomness inside a step** (dropout masks, data augmentation): different on every rank. With
  one seed everywhere, every rank drops the same units of its rows: the ranks' noise is no longer
  independent, and a global batch of ``w x b`` rows gets the dropout pattern of ``b``. Seed such
  randomness with ``seed + rank`` (what ``ddp_worker`` does for its models' seeds, before DDP's
  broadcast makes the weights equal).
* **The gradient norm** that ``clip_grad_norm_`` measures: after the sync (torch DDP: when
  ``backward()`` returns) every rank holds the averaged gradient, so all compute the same norm
  and clip by the same factor. Each rank's own gradient, before the sync, has a norm of its own.

``seeds_and_norms`` measures all three on every rank.

Taught in chapter 04 (appendix 04a, section 2).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["seeds_and_norms"]


def _model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))


def seeds_and_norms(seed: int = 0, rows: int = 32) -> dict:
    """On every rank (call through ``launch``). For a shared seed and for ``seed + rank``:
    the first weight before and after wrapping in DDP, and a dropout mask of this rank's batch.
    Then the gradient norm before the sync (``no_sync``) and after it.

    Returns ``{"shared" | "per rank": {"weight before", "weight after": float, "mask": [rows, 32]
    bool}, "norm before sync": float, "norm after sync": float}``.
    """
    rank = dist.get_rank()
    out = {}
    x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(100 + rank))  # this rank's rows
    for name, model_seed in (("shared", seed), ("per rank", seed + rank)):
        model = _model(model_seed)
        before = model[0].weight[0, 0].item()
        ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights
        dropout_mask = ddp.module[2](torch.ones(rows, 32)) != 0  # the dropout's random draw, this rank
        out[name] = {
            "weight before": before,
            "weight after": model[0].weight[0, 0].item(),
            "mask": dropout_mask,
        }
    ddp.eval()  # no dropout: the two gradients below differ only by the sync
    with ddp.no_sync():
        ddp(x).square().mean().backward()
    out["norm before sync"] = float(nn.utils.clip_grad_norm_(ddp.parameters(), float("inf")))
    ddp.zero_grad()
    ddp(x).square().mean().backward()
    out["norm after sync"] = float(nn.utils.clip_grad_norm_(ddp.parameters(), float("inf")))
    return out
