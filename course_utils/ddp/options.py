"""Two options of torch's DDP, seen at work: ``find_unused_parameters`` and ``broadcast_buffers``.

``find_unused_parameters`` (default False). DDP's reducer waits, in every backward, for a
gradient from *every* parameter before its last bucket can leave. A parameter the forward did
not use (a branch taken only sometimes, a head for another task) never gets one, so the
iteration never finishes its reduction, and the next forward raises. With
``find_unused_parameters=True`` DDP walks the autograd graph after each forward, marks the
parameters it does not reach as ready at once, and the step completes (at the cost of that
walk, every iteration).

``broadcast_buffers`` (default True; torch 2.13 renames it ``forward_sync_buffers`` and
deprecates the old name; ``buffer_sync_option`` picks the one the installed torch knows).
Buffers (BatchNorm's ``running_mean``...) are not gradients: DDP does not average them.
Instead, before every forward it broadcasts rank 0's buffers to all ranks, so every rank's
running statistics are rank 0's (computed on rank 0's rows only). With
``broadcast_buffers=False`` each rank keeps its own. (``SyncBatchNorm`` is the module that
really computes batch statistics over all ranks.)

Taught in chapter 04 (appendix 04a, section 6: DDP's options).
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_utils.runtime.hardware import rank_device

__all__ = ["TwoHeads", "train_with_unused_head", "running_means", "buffer_sync_option"]


def buffer_sync_option(sync: bool) -> dict:
    """DDP's keyword for "broadcast rank 0's buffers before every forward" in this torch:
    ``{"forward_sync_buffers": sync}`` (torch 2.13 and later), else ``{"broadcast_buffers": sync}``."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": sync}
    return {"broadcast_buffers": sync}


class TwoHeads(nn.Module):
    """A trunk and two heads; ``forward`` uses only ``head_a``, so ``head_b`` gets no gradient.

    x: ``[batch, 4]`` -> ``[batch, 1]``.
    """

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 8)
        self.head_a = nn.Linear(8, 1)
        self.head_b = nn.Linear(8, 1)  # never used in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_a(torch.relu(self.trunk(x)))


def train_with_unused_head(find_unused_parameters: bool, steps: int = 3) -> dict:
    """``steps`` SGD steps of ``DDP(TwoHeads(), find_unused_parameters=...)`` on this rank.

    Call on every rank (under ``launch``). Batches: ``[8, 4]`` random rows per rank. Returns
    ``{"steps": steps done, "error": the RuntimeError's first line, or None}``.
    """
    torch.manual_seed(0)
    device = rank_device()  # under NCCL this rank's GPU, else the CPU
    model = DistributedDataParallel(TwoHeads().to(device), find_unused_parameters=find_unused_parameters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    done = 0
    try:
        for _ in range(steps):
            x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            done += 1
    except RuntimeError as err:
        return {"steps": done, "error": str(err).strip().splitlines()[0]}
    return {"steps": done, "error": None}


def running_means(broadcast_buffers: bool, steps: int = 3) -> torch.Tensor:
    """BatchNorm's ``running_mean`` (``[4]``) as this rank's last forward saw it, after ``steps``
    steps of ``DDP(Linear -> BatchNorm1d, broadcast_buffers=...)``; call on every rank.

    Each rank's rows have a different mean (rank r's are shifted by ``3 r``), so the buffers
    tell whose rows they were computed from. A forward pre-hook on the BatchNorm records the
    buffer when the forward reaches it, i.e. after DDP's broadcast (if any).
    """
    torch.manual_seed(0)
    device = rank_device()  # under NCCL this rank's GPU, else the CPU
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(device)
    seen = {}
    net[1].register_forward_pre_hook(lambda module, args: seen.update(mean=module.running_mean.clone()))
    model = DistributedDataParallel(net, **buffer_sync_option(broadcast_buffers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=generator).to(device) + 3.0 * rank
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    return seen["mean"]
