"""DDP by hand, step 2: buckets of gradients all-reduced *while backward is still running*.

The diff from ``naive.py``:

* the parameters are grouped into **buckets** of about ``bucket_cap_mb`` each;
* a **post-accumulate-grad hook** on every parameter fires the moment backward
  has written its ``.grad``; the hook copies the gradient into its bucket's flat
  buffer, and when a bucket is full it **starts an asynchronous all_reduce**
  (``async_op=True``) and returns, so backward goes on computing the next
  gradients while the bucket travels: communication overlaps computation;
* ``finish_gradient_sync()`` now only **waits** for the all-reduces still in
  flight and copies the averaged buckets back into ``.grad``.

Which parameters share a bucket matters. A bucket can only leave when its
*last* gradient is ready, so a bucket should hold gradients that backward
produces one after the other. Ours fills the first backward's buckets in reverse
order of ``model.parameters()`` (a guess) and records the order the gradients
really arrive in; after it, the buckets are rebuilt in that order (rank 0's,
broadcast, so every rank agrees). In a DLRM the guess is poor: the bottom MLP is
registered after the tables but gets its gradients last.

What torch's DDP does (``torch/nn/parallel/distributed.py``, ``_ddp_init_helper``):
with ``find_unused_parameters=False`` (the default) or ``static_graph=True`` it gives
``dist._compute_bucket_assignment_by_size`` the limit ``sys.maxsize``, so the *first*
iteration has **one bucket holding every gradient**, all-reduced once the whole
backward is done (no overlap; its comment: parameters need not be in execution
order, and an early all-reduce could pair with another collective). The reducer
records the order the gradients arrive in, and at the start of the second forward
(``reducer._rebuild_buckets()``) rebuilds the buckets in that order with 1 MiB for
the first and 25 MiB for the others. With ``find_unused_parameters=True`` its
first iteration does guess: buckets cut from the parameters in registration order
(the first closed once it passes 1 MiB), launched last to first; an order guess like ours, cut at
other places. After the rebuild both agree, bucket for bucket.

Buckets are launched strictly in order (bucket 1 only after bucket 0, ...) even
if a later one fills first: every rank must issue the same collectives in the
same order, or they would add up the wrong tensors, or hang. Few large messages
also beat many small ones (each all_reduce pays a fixed latency).
``torch.nn.parallel.DistributedDataParallel`` does all of this in C++ (its
``Reducer``), with the same bucket sizes: 1 MiB for the first, 25 MiB after.
``settle_ddp_buckets`` gives torch's DDP its rebuilt buckets before the first step,
so that a resumed run adds gradients in the same order as an uninterrupted one.

Taught in chapter 04 (section 5); ``settle_ddp_buckets`` in chapter 08 (section 3).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from course_utils.ddp.naive import NaiveDDP

__all__ = ["Bucket", "make_buckets", "BucketedDDP"]


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one all_reduce.

    buffer: ``[sum of numels]`` flat tensor, the parameters' gradients side by side.
    offsets: where each parameter's gradient starts in ``buffer``.
    """

    params: list
    names: list
    buffer: torch.Tensor
    offsets: list
    ready: int = 0
    work: object = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def view(self, i: int) -> torch.Tensor:
        """The slice of ``buffer`` that holds parameter ``i``'s gradient, shaped like it."""
        p = self.params[i]
        return self.buffer[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)


def make_buckets(
    named_params: list[tuple[str, nn.Parameter]], cap_bytes: int, first_cap_bytes: int | None = None
) -> list[Bucket]:
    """Group parameters, in the order given, into buckets: a bucket takes parameters
    until it holds at least ``cap_bytes`` (``first_cap_bytes`` for the first one),
    torch DDP's rule. A bucket holds parameters of one device and dtype only."""
    groups, size = [], 0
    for name, p in named_params:
        same_kind = bool(groups) and (groups[-1][0][1].device, groups[-1][0][1].dtype) == (p.device, p.dtype)
        cap = first_cap_bytes or cap_bytes if len(groups) == 1 else cap_bytes
        if not groups or size >= cap or not same_kind:
            groups.append([])
            size = 0
        groups[-1].append((name, p))
        size += p.numel() * p.element_size()
    buckets = []
    for group in groups:
        offsets = [0]
        for _, p in group:
            offsets.append(offsets[-1] + p.numel())
        first = group[0][1]
        buckets.append(
            Bucket(
                [p for _, p in group],
                [n for n, _ in group],
                torch.zeros(offsets[-1], dtype=first.dtype, device=first.device),
                offsets[:-1],
            )
        )
    return buckets


class BucketedDDP(NaiveDDP):
    """``NaiveDDP`` whose all-reduces start from gradient hooks during backward.

    bucket_cap_mb / first_bucket_cap_mb: bucket sizes in MiB (torch DDP's defaults: 25 and 1).
    buckets: the ``Bucket`` list, in launch order (rebuilt after the first synced backward).
    """

    def __init__(
        self, module: nn.Module, bucket_cap_mb: float = 25.0, first_bucket_cap_mb: float = 1.0, group=None
    ):
        super().__init__(module, group)
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise ValueError(
                f"bucket sizes must be positive MiB, got {bucket_cap_mb} and {first_bucket_cap_mb}"
            )
        self._caps = int(bucket_cap_mb * 2**20), int(first_bucket_cap_mb * 2**20)
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._build_buckets(order=list(range(len(self._named)))[::-1])  # first guess: reverse order
        self.buckets_rebuilt, self._ready_order = False, []
        self._hooks = [
            p.register_post_accumulate_grad_hook(functools.partial(self.on_gradient_ready, index))
            for index, (_, p) in enumerate(self._named)
        ]

    def _build_buckets(self, order: list[int]) -> None:
        self.buckets = make_buckets([self._named[i] for i in order], *self._caps)
        index_of = {id(p): i for i, (_, p) in enumerate(self._named)}
        self._slot = {index_of[id(p)]: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._next_to_launch = 0

    def on_gradient_ready(self, index: int, param: nn.Parameter) -> None:  # runs inside backward
        if not self.require_gradient_sync:
            return  # no_sync: leave .grad local
        if not self.buckets_rebuilt:
            self._ready_order.append(index)
        bucket, i = self._slot[index]
        with torch.no_grad():
            bucket.view(i).copy_(param.grad)
        bucket.ready += 1
        self.launch_full_buckets()

    def launch_full_buckets(self) -> None:
        """Start the all_reduce of every full bucket whose predecessors are already started."""
        while self._next_to_launch < len(self.buckets):
            bucket = self.buckets[self._next_to_launch]
            if bucket.ready < len(bucket.params):
                return
            bucket.buffer.div_(self.world_size)  # average = sum of (grad / W)
            bucket.work = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
            self.collectives_launched += 1
            self._next_to_launch += 1

    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """Wait for the buckets' all-reduces and write the averaged gradients back to ``.grad``."""
        if not self.require_gradient_sync:
            return
        unfinished = [name for b in self.buckets if b.work is None for name in b.names]
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
        # details: a bucket that never filled (a parameter without gradient) is an error
        if unfinished:
            self._reset()
            raise RuntimeError(
                f"parameters {unfinished[:5]} got no gradient in this backward (or backward "
                "was not called), so their buckets never filled; every rank must give every "
                "parameter a gradient (or freeze it with requires_grad_(False))"
            )
        # end details
        for bucket in self.buckets:
            for i, p in enumerate(bucket.params):
                p.grad.copy_(bucket.view(i))
        self._reset()
        if not self.buckets_rebuilt:
            self._rebuild_buckets()

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.ready, bucket.work = 0, None
        self._next_to_launch = 0

    def _rebuild_buckets(self) -> None:
        """Rebuild the buckets in the order the gradients arrived (rank 0's order, on every rank)."""
        # on the parameters' device: an NCCL group has no CPU backend (and on the CPU for a model
        # on the meta device, whose tensors hold no numbers to send)
        device = next(self.module.parameters()).device
        order = torch.tensor(
            self._ready_order, dtype=torch.int64, device="cpu" if device.type == "meta" else device
        )
        dist.broadcast(order, src=self.src, group=self.group)
        self._build_buckets(order.tolist())
        self.buckets_rebuilt = True


# --- torch's DDP rebuilds its buckets the same way: settle them before the first step ---------


def settle_ddp_buckets(ddp_model, *example_inputs) -> None:
    """One throwaway forward and backward, so that DDP has fixed its gradient buckets.

    DDP first packs all the gradients into one bucket (with the default
    ``find_unused_parameters=False``), then, at the second forward, repacks them into
    1 MiB / 25 MiB buckets in the order the first backward produced them. With
    more than two ranks the all-reduce adds the ranks' values in an order that depends
    on a value's position in its bucket, so a freshly built DDP (a resumed run) would add
    in another order than a long-running one and drift in the last bits. Calling this
    right after wrapping, in every run, gives every run the same buckets from step 1.
    The gradients it makes are dropped; nothing else changes.
    """
    ddp_model(*example_inputs).sum().backward()
    for p in ddp_model.parameters():
        p.grad = None
