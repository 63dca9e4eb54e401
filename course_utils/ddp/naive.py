"""DDP by hand, step 1: all-reduce every gradient after backward.

Every rank holds a full copy of the model and trains on its own share of each
global batch. Two things keep the copies identical:

1. at the start, rank 0's parameters are **broadcast** to every rank;
2. after each backward, every gradient is **averaged over the ranks**
   (``all_reduce`` sums, then ``/ world_size``), so every rank takes the same
   optimizer step.

The training loop calls ``finish_gradient_sync()`` between ``backward()`` and
``optimizer.step()``. Here that call does all the communication, one blocking
``all_reduce`` per parameter, while nothing else runs: the simplest correct DDP.
``bucketed.py`` changes only *when* the all-reduces run.

Taught in chapter 04 (section 2, DDP by hand, step 1).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["broadcast_parameters", "NaiveDDP"]


@torch.no_grad()
def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> None:
    """Overwrite every rank's parameters and buffers with those of rank ``src``."""
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor, src, group=group)


class NaiveDDP(nn.Module):
    """Data parallel training across the ranks of ``group`` (default: all ranks).

    forward(*inputs): ``module(*inputs)`` on this rank's rows (nothing else).
    finish_gradient_sync(): call after ``loss.backward()``; afterwards every
        parameter's ``.grad`` holds the mean of the ranks' gradients.
    no_sync(): a context in which backward leaves the gradients local (they
        accumulate in ``.grad``); the next synced backward averages the sum.
    collectives_launched: how many all-reduces this wrapper has started so far.
    """

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "DDP needs an initialised process group: run inside course_utils.launch(...) "
                "or torchrun, or call dist.init_process_group first"
            )
        self.module, self.group = module, group
        self.world_size = dist.get_world_size(group)
        self.require_gradient_sync = True
        self.collectives_launched = 0
        self.src = dist.get_global_rank(group, 0) if group is not None else 0  # the group's first rank
        broadcast_parameters(module, src=self.src, group=group)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Skip the gradient averaging for backward passes run inside this block."""
        before, self.require_gradient_sync = self.require_gradient_sync, False
        try:
            yield
        finally:
            self.require_gradient_sync = before

    def _parameters_with_gradients(self) -> list[nn.Parameter]:
        params = [p for p in self.module.parameters() if p.requires_grad]
        missing = [name for name, p in self.module.named_parameters() if p.requires_grad and p.grad is None]
        if missing:
            raise RuntimeError(
                f"parameters {missing[:5]} got no gradient in this backward; every rank must "
                "give every parameter a gradient (or freeze it with requires_grad_(False))"
            )
        return params

    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """Average every gradient over the ranks: one blocking all_reduce per parameter."""
        if not self.require_gradient_sync:
            return
        for p in self._parameters_with_gradients():
            p.grad.div_(self.world_size)  # divide first, then sum: as torch DDP does
            dist.all_reduce(p.grad, group=self.group)
            self.collectives_launched += 1
