"""How PyTorch's DDP finishes its gradient sync inside ``loss.backward()``, and why ``no_sync``
must wrap the forward.

Our ``BucketedDDP`` needs an explicit ``finish_gradient_sync()`` after ``backward()``. PyTorch's
reducer needs none: once it has launched the all-reduce of its last bucket
(``Reducer::mark_variable_ready`` in ``torch/csrc/distributed/c10d/reducer.cpp``), it asks the
autograd engine to run a callback when the whole backward is done (``queue_callback`` of
``finalize_backward``), and that callback waits for the buckets and writes the averages into
``.grad``. ``SyncInBackward`` does the same with our buckets, but queues its callback at the first
gradient of a backward (``compat.queue_autograd_callback``): ``loss.backward()`` returns with the
gradients averaged.

PyTorch decides *in forward* whether the next backward syncs: ``DistributedDataParallel.forward``
calls ``reducer.prepare_for_backward`` only when ``require_backward_grad_sync`` is set, which
``no_sync()`` clears. So ``no_sync`` takes effect on the forward it wraps.
``no_sync_placements`` counts the all-reduces of three placements (``counting_hook``):

* forward and backward of the early micro-batches inside ``no_sync``: one sync per step;
* only their backward inside: the forward has already prepared the reducer, so every
  micro-batch is all-reduced (same weights, since averaging is linear, none of the saving);
* the last micro-batch's forward inside, its backward outside: nothing is all-reduced, and the
  ranks' weights part.

Taught in chapter 04 (appendix 04a, section 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from course_utils.ddp.bucketed import BucketedDDP
from course_utils.runtime import compat

__all__ = ["SyncInBackward", "counting_hook", "no_sync_placements"]


class SyncInBackward(BucketedDDP):
    """``BucketedDDP`` whose sync ends inside ``backward()``: no ``finish_gradient_sync()`` call."""

    _finish_queued = False

    def on_gradient_ready(self, index: int, param: nn.Parameter) -> None:  # runs inside backward
        if self.require_gradient_sync and not self._finish_queued:
            self._finish_queued = True  # once per backward, at its first gradient
            compat.queue_autograd_callback(self._finish)
        super().on_gradient_ready(index, param)

    def _finish(self) -> None:  # the engine runs it when this backward is done
        self._finish_queued = False
        super().finish_gradient_sync()

    def finish_gradient_sync(self) -> None:
        """Nothing left to do: the engine already ran the sync at the end of backward."""


def counting_hook(calls: list):
    """A DDP communication hook that does what DDP does by default (``allreduce_hook``: divide by
    the world size, all-reduce) and appends each bucket's bytes to ``calls``."""

    def hook(state, bucket):  # (no annotations: DDP checks them, and this file's are strings)
        calls.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(state, bucket)

    return hook


def no_sync_placements(steps: int = 3, micro_batches: int = 2, rows: int = 16) -> dict:
    """On every rank (call through ``launch``): torch DDP on a small MLP, ``micro_batches`` per step,
    with ``no_sync`` placed three ways (module docstring). Returns ``{placement: {"all_reduces":
    per step, "weights": this rank's flat parameters [n]}}``."""
    g = torch.Generator().manual_seed(dist.get_rank())
    data = [torch.randn(rows, 8, generator=g) for _ in range(steps * micro_batches)]
    out = {}
    for placement in ("forward and backward", "backward only", "last forward inside"):
        torch.manual_seed(0)
        calls: list[int] = []
        model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
        model.register_comm_hook(None, counting_hook(calls))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = iter(data)
        for _ in range(steps):
            for micro in range(micro_batches):
                last = micro == micro_batches - 1
                x = next(batches)
                if placement == "forward and backward" and not last:
                    with model.no_sync():
                        model(x).square().mean().backward()
                elif placement == "backward only" and not last:
                    loss = model(x).square().mean()
                    with model.no_sync():
                        loss.backward()
                elif placement == "last forward inside" and last:
                    with model.no_sync():
                        loss = model(x).square().mean()
                    loss.backward()
                else:
                    model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        out[placement] = {
            "all_reduces": len(calls) // steps,
            "weights": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        }
    return out
