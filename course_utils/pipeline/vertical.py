"""One training step of a vertical split on ranks, each rank a GPU: the hop is a message.

``split_step`` runs on every rank of ``launch(split_step, model, x, y, world_size=p,
cluster=...)``: rank ``k`` holds part ``k`` of ``model`` (``partition_sequential``), receives
the activation from rank ``k-1``, runs its part, sends its output to rank ``k+1``; the last
rank computes the loss, and the gradients travel back the same way. What ``.to(device)``
does between two GPUs of one machine is, on the modeled cluster, a message on its network:
``alpha + n / beta`` for ``n`` bytes. On one rank (``world_size=1``) it is the whole model on
one GPU, with no hop.

``as_timeline`` joins the ranks' results into the pipeline ``Timeline`` (ms) that chapter 06's
schedules produce: ``F(k,0)`` and ``B(k,0)`` per part ``k`` (one micro-batch, so a bubble of
``(p-1)/p`` and more), the picture pipeline parallelism sets out to fill.

Taught in chapter 05 (section 3, the measured step); chapter 06 starts from it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils.model_parallel import partition_sequential
from course_utils.pipeline.schedules import Action
from course_utils.pipeline.timeline import Event, Timeline
from course_utils.runtime import cluster
from course_utils.runtime.timing import now

__all__ = ["split_step", "as_timeline"]


def split_step(
    model: nn.Sequential,
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: Sequence[int] | None = None,
    loss_fn=nn.functional.mse_loss,
) -> dict:
    """Run on every rank: one forward and backward of part ``rank`` of ``model``.

    ``x [B, in]``, ``y [B, out]``: the batch (only the first rank reads ``x``, only the last
    ``y``); the activations between parts have ``y``'s shape ``[B, out]``, as in the course's
    towers. ``sizes``: layers per part (default: equal). Returns ``{"events": [(kind, start ms,
    end ms)] of this rank's F and B, "step_ms": its step, "timeline": its ClusterTimeline}``
    (the timeline on a modeled cluster only). Gradients are left in the part's ``.grad``.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    part = partition_sequential(model, sizes or p)[rank]
    first, last = rank == 0, rank == p - 1
    dist.barrier()  # every rank starts together
    t0, events = _origin(), []

    def timed(kind, fn, *args):
        start = (now() - t0) * 1e3
        out = fn(*args)
        events.append((kind, start, (now() - t0) * 1e3))
        return out

    h = x if first else _recv(torch.empty_like(y), rank - 1)  # the hop in: part k-1's output
    h.requires_grad_(not first)
    out = timed("F", lambda: loss_fn(part(h), y) if last else part(h))
    if not last:
        dist.send(out.detach(), rank + 1)  # the hop out, to the next part's GPU
    grad = None if last else _recv(torch.empty_like(out), rank + 1)  # d loss / d out, coming back
    timed("B", torch.autograd.backward, out, grad)
    if not first:
        dist.send(h.grad, rank - 1)  # d loss / d input, back to the previous part
    return {
        "events": events,
        "step_ms": (now() - t0) * 1e3,
        "timeline": cluster.timeline() if cluster.installed() is not None else None,
    }


def _origin() -> float:
    """The step's time zero, the same on every rank: on a modeled cluster the barrier has lined
    up the virtual clocks; on wall time each rank leaves the barrier when the OS runs it, so the
    ranks take rank 0's reading (one monotonic clock serves every process of a machine)."""
    if cluster.installed() is not None:
        return now()
    origin = [now()]
    dist.broadcast_object_list(origin, src=0)
    return origin[0]


def _recv(buffer: torch.Tensor, src: int) -> torch.Tensor:
    dist.recv(buffer, src)
    return buffer


def as_timeline(results: list[dict], name: str = "vertical model parallel, 1 step") -> Timeline:
    """The ranks' ``split_step`` results as one pipeline ``Timeline`` (ms): part ``k`` on row ``k``."""
    events = tuple(
        Event(k, Action(kind, k, 0), start, end)
        for k, r in enumerate(results)
        for kind, start, end in r["events"]
    )
    return Timeline(events, len(results), name=name, unit="ms")
