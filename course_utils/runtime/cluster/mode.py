"""``ChargeMode``: the dispatch mode that prices every ATen operator a rank runs.

A ``TorchDispatchMode`` (``compat.DISPATCH_MODE_BASE``) sees each operator after autograd has
decomposed it, on the thread that runs it: a model's forward kernels, its backward kernels, the
optimizer's, DDP's reducer copying gradients into its buckets and dividing them. For each one it

1. waits, in virtual time, for any communication that writes one of its tensors (the clock's
   ``wait_for_tensors``: a GPU stream that waited for NCCL does the same);
2. runs it, for real (the numbers are never modeled);
3. charges its roofline cost (``roofline.op_cost``) to the rank's clock.

Inside the process group's own methods the clock is ``suspended``: their bookkeeping is free,
and the group prices the communication itself. Only the rank's own thread, and a callback's
account, are charged: gloo's worker threads inherit the mode with the rest of the thread-local
state and copy results into place under it, which is not the GPU's work. Tensor subclasses
(DTensor) are left to dispatch themselves first (``NotImplemented``); the plain operators they
run come back here.

Taught in chapter 02 (virtual time: what is charged).
"""

from __future__ import annotations

import torch

from course_utils.runtime import compat
from course_utils.runtime.cluster.roofline import op_cost

__all__ = ["ChargeMode"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class ChargeMode(compat.DISPATCH_MODE_BASE):
    """Charges every operator run under it to ``clock`` (a ``clock.RankClock``)."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        clock = self.clock
        if clock.suspended or not clock.charges_this_thread():
            return func(*args, **kwargs)
        if any(t not in _PLAIN for t in types):
            return NotImplemented
        if clock.tags:
            clock.wait_for_tensors(args, kwargs)
        out = func(*args, **kwargs)
        cost = op_cost(func, args, kwargs, out, clock.cluster)
        if cost is not None:
            clock.charge(cost)
        return out
