"""Each collective timed on a wire, next to what the wire's model predicts for it.

``time_operations`` runs on every rank (under ``launch(..., wire=...)`` or without a wire,
for gloo's own time) and returns, per operation and size, the median seconds the slowest rank
saw. ``predicted_seconds`` is the model's figure for the same call (``wire.model``), so a
benchmark or a chapter can put the two side by side.

The sizes are the bytes of the tensor each operation is given (``nbytes``, float32):

* all_reduce, broadcast, send/recv: a tensor of ``nbytes``;
* all_gather: each rank contributes ``nbytes / w`` (the gathered result is ``nbytes``);
* reduce_scatter: each rank gives ``nbytes`` and keeps ``nbytes / w``;
* all_to_all: each rank sends ``nbytes / w`` to every rank (itself included).

Taught in chapter 02 (the wire, measured against its model).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from course_utils.runtime.wire import Wire, collective_seconds

__all__ = ["CHECKED", "time_operations", "predicted_seconds", "cpu_share_while_waiting"]

CHECKED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send")


def _call(op: str, nbytes: int):
    """A function running ``op`` once on this rank's tensors for a message of ``nbytes``."""
    w, me = dist.get_world_size(), dist.get_rank()
    n = max(w, nbytes // 4 // w * w)  # float32 elements, a multiple of w
    full, part = torch.zeros(n), torch.zeros(n // w)
    parts = [torch.zeros(n // w) for _ in range(w)]
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    if op == "all_gather":
        return lambda: dist.all_gather(parts, part)
    if op == "reduce_scatter":
        chunks = list(full.chunk(w))
        return lambda: dist.reduce_scatter(part, chunks)
    if op == "all_to_all":
        out = torch.zeros(n)
        return lambda: dist.all_to_all_single(out, full)
    if op == "send":  # rank 0 sends to rank 1; the others take no part
        if me == 0:
            return lambda: dist.send(full, dst=1)
        if me == 1:
            return lambda: dist.recv(full, src=0)
        return lambda: None
    raise ValueError(f"unknown operation {op!r}; checked are {', '.join(CHECKED)}")


def time_operations(ops: list[str], sizes: list[int], repeats: int = 5) -> list[dict]:
    """Median seconds per call of each op at each size, the slowest rank's; run on every rank.

    Returns rows ``{"op", "nbytes", "world_size", "seconds"}``. Each timing starts the ranks
    together (a barrier) and ends when the slowest rank has finished.
    """
    rows = []
    for op in ops:
        for nbytes in sizes:
            call = _call(op, nbytes)
            call()  # warm-up: connections, first use of the memory
            times = []
            for _ in range(repeats):
                dist.barrier()
                start = time.monotonic()
                call()
                slowest = torch.tensor([time.monotonic() - start], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                times.append(slowest.item())
            rows.append(
                {
                    "op": op,
                    "nbytes": nbytes,
                    "world_size": dist.get_world_size(),
                    "seconds": statistics.median(times),
                }
            )
    return rows


def predicted_seconds(wire: Wire, op: str, nbytes: int, world_size: int) -> float:
    """The model's seconds for ``_call(op, nbytes)`` on ``world_size`` ranks, all in one tier."""
    alpha, beta = wire.link(list(range(world_size)))
    w = world_size
    n = max(w, nbytes // 4 // w * w) * 4  # the bytes _call really moves
    if op == "all_to_all":
        return collective_seconds(op, n - n // w, w, alpha, beta)
    return collective_seconds(op, n, 2 if op == "send" else w, alpha, beta)


def cpu_share_while_waiting(seconds: float = 1.0) -> float:
    """CPU time this rank spends while one modeled all-reduce of ``seconds`` runs, as a
    fraction of one core (run on every rank, under a wire whose latency makes it last that long)."""
    t = torch.zeros(1)
    dist.barrier()
    cpu, wall = time.process_time(), time.monotonic()
    dist.all_reduce(t)
    return (time.process_time() - cpu) / (time.monotonic() - wall)
