"""Every collective the course uses, run on a few ranks: each rank's tensor before and after.

Rank ``r`` starts with ``[10r, 10r + 1, ..., 10r + w - 1]`` (``w`` = world size),
so the tens digit of a number says which rank it came from and the units digit
its position: after ``all_to_all`` rank 1 holds ``[1, 11, 21, 31]``. Each
``demo_*`` function runs inside a rank (through ``launch``) and returns
``(before, after)`` as lists; ``run_all`` runs them all; ``picture`` prints a
result as text and ``plot`` draws all of them, colouring each number by the rank
it came from (grey: a sum of several ranks).

Taught in chapter 02 (section 4, every collective, before and after).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_utils.runtime.hardware import rank_device
from course_utils.runtime.versions import all_to_all


def start_tensor(length: int | None = None) -> torch.Tensor:
    """Rank r's starting tensor ``[10r, 10r + 1, ...]``: ``[length]`` float32 (default: world size)."""
    rank, w = dist.get_rank(), dist.get_world_size()
    n = w if length is None else length
    return (10 * rank + torch.arange(n, dtype=torch.float32)).to(rank_device())


def _out(t: torch.Tensor) -> list:
    return [int(x) for x in t.cpu().tolist()]


def demo_broadcast():
    """broadcast(t, src=0): every rank gets rank 0's tensor."""
    t = start_tensor()
    before = _out(t)
    dist.broadcast(t, src=0)
    return before, _out(t)


def demo_reduce():
    """reduce(t, dst=0): rank 0 gets the element-wise sum; the others' tensors are not promised."""
    t = start_tensor()
    before = _out(t)
    dist.reduce(t, dst=0)  # op=dist.ReduceOp.SUM by default
    return before, _out(t)


def demo_all_reduce():
    """all_reduce(t): every rank gets the element-wise sum (a reduce, then a broadcast)."""
    t = start_tensor()
    before = _out(t)
    dist.all_reduce(t)
    return before, _out(t)


def demo_all_gather():
    """all_gather(parts, t): every rank gets every rank's tensor, in rank order."""
    t = start_tensor(1)  # one number per rank: [10r]
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return _out(t), _out(torch.cat(parts))


def demo_gather():
    """gather(t, parts, dst=0): rank 0 gets every rank's tensor, in rank order; the others nothing."""
    t = start_tensor(1)  # one number per rank: [10r]
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())] if dist.get_rank() == 0 else None
    dist.gather(t, parts, dst=0)  # only the destination passes a list
    return _out(t), _out(torch.cat(parts)) if parts is not None else []


def demo_scatter():
    """scatter(out, parts, src=0): rank 0's tensor is cut into w pieces; rank r gets piece r."""
    t = start_tensor()
    out = torch.empty(1, device=t.device)
    parts = list(t.chunk(dist.get_world_size())) if dist.get_rank() == 0 else None
    dist.scatter(out, parts, src=0)  # only the source passes a list
    return _out(t), _out(out)


def demo_reduce_scatter():
    """reduce_scatter(out, parts): the sum is cut into w pieces; rank r gets piece r."""
    t = start_tensor()
    out = torch.empty(1, device=t.device)
    dist.reduce_scatter(out, list(t.chunk(dist.get_world_size())))
    return _out(t), _out(out)


def demo_all_to_all():
    """all_to_all(outs, ins): rank r's piece j goes to rank j, as its piece r (a transpose)."""
    t = start_tensor()
    outs = [torch.empty(1, device=t.device) for _ in range(dist.get_world_size())]
    all_to_all(
        outs, list(t.chunk(dist.get_world_size()))
    )  # dist.all_to_all (paired sends where gloo lacks it)
    return _out(t), _out(torch.cat(outs))


def demo_send_recv():
    """send / recv in pairs (0 <-> 1, 2 <-> 3): blocking, so one side sends first."""
    t = start_tensor()
    before, rank = _out(t), dist.get_rank()
    partner, received = rank ^ 1, torch.empty_like(t)  # 0<->1, 2<->3
    if partner >= dist.get_world_size():
        return before, before  # an odd world: the last rank has no partner
    if rank % 2 == 0:  # even ranks send then receive, odd ranks the reverse: no deadlock
        dist.send(t, dst=partner)
        dist.recv(received, src=partner)
    else:
        dist.recv(received, src=partner)
        dist.send(t, dst=partner)
    return before, _out(received)


def demo_isend_irecv():
    """isend / irecv around a ring: each rank passes its tensor to the right, all at once.

    The send and the receive are posted together, in one ``batch_isend_irecv``: posted one
    by one, every rank's send could wait on NCCL for a receive its neighbour has not posted.
    """
    t = start_tensor()
    rank, w = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(t)
    requests = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, t, (rank + 1) % w), dist.P2POp(dist.irecv, received, (rank - 1) % w)]
    )
    for request in requests:  # both are in flight; wait for both
        request.wait()
    return _out(t), _out(received)


def demo_barrier():
    """barrier(): nobody leaves before everybody has arrived (rank r arrives 50 r ms late).

    Every rank reads the same clock: ``time.monotonic_ns`` is the machine's monotonic clock
    (CLOCK_MONOTONIC on Linux), shared by all its processes, so the ranks' times compare
    directly. A rank reads ``arrived`` before it enters the barrier and ``left`` after it
    leaves, so every rank's ``left_s`` is at least the last ``arrived_s``, exactly: no
    tolerance, however busy the machine. Times are in seconds from the first rank's start.
    """
    t = start_tensor()
    dist.barrier()  # line the ranks up first
    start = time.monotonic_ns()
    time.sleep(0.05 * dist.get_rank())
    arrived = time.monotonic_ns()
    dist.barrier()
    left = time.monotonic_ns()
    stamps = torch.tensor([start, arrived, left], dtype=torch.int64, device=t.device)  # exact integers
    everyone = [torch.empty_like(stamps) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, stamps)
    origin = min(int(x[0]) for x in everyone)
    last_arrival = max(int(x[1]) for x in everyone)
    # an exact integer difference, then one rounding, which keeps the order of the times
    arrived_s, left_s, last_s = ((ns - origin) / 1e9 for ns in (arrived, left, last_arrival))
    return _out(t), _out(t), {"arrived_s": arrived_s, "left_s": left_s, "last_arrival_s": last_s}


DEMOS = {
    "broadcast": demo_broadcast,
    "reduce": demo_reduce,
    "all_reduce": demo_all_reduce,
    "all_gather": demo_all_gather,
    "gather": demo_gather,
    "scatter": demo_scatter,
    "reduce_scatter": demo_reduce_scatter,
    "all_to_all": demo_all_to_all,
    "send/recv": demo_send_recv,
    "isend/irecv": demo_isend_irecv,
    "barrier": demo_barrier,
}


def run_all() -> dict:
    """Run every demo in this rank, in order; ``{name: (before, after[, extra])}``."""
    return {name: demo() for name, demo in DEMOS.items()}


def gather_results(per_rank: list[dict]) -> dict:
    """``launch``'s per-rank results -> ``{name: (befores, afters)}``, lists in rank order."""
    return {name: ([r[name][0] for r in per_rank], [r[name][1] for r in per_rank]) for name in per_rank[0]}


def picture(name: str, befores: list[list[int]], afters: list[list[int]]) -> str:
    """A text picture of one collective: a row per rank, its tensor before -> after."""
    width = max(len(str(x)) for row in befores + afters for x in row)
    cells = lambda row: "[" + " ".join(str(x).rjust(width) for x in row) + "]"  # noqa: E731
    left = max(len(cells(b)) for b in befores)
    lines = [DEMOS[name].__doc__.splitlines()[0], f"        {'before'.ljust(left)}      after"]
    lines += [
        f"rank {r}  {cells(b).ljust(left)}  ->  {cells(a)}"
        for r, (b, a) in enumerate(zip(befores, afters, strict=False))
    ]
    return "\n".join(lines)


def _origin_colours(values: list[list[int]], starts: dict[int, int]):
    """Per cell: the colour of the rank a value came from, light grey if it is a sum."""
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10")

    def light(rgba):  # halfway to white, so the black numbers stay readable
        return tuple(0.5 + 0.5 * c for c in rgba[:3]) + (1.0,)

    return [
        [light(palette(starts[v])) if v in starts else (0.85, 0.85, 0.85, 1.0) for v in row] for row in values
    ]


def plot(results: dict, names: list[str] | None = None):
    """Draw ``results`` (from ``gather_results``): before and after for each collective.

    Each number is coloured by the rank it started on, so data movement shows as
    colours moving between rows; grey numbers are sums of several ranks.
    """
    import matplotlib.pyplot as plt

    names = [n for n in (names or list(results)) if n != "barrier"]
    cols = 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, 2 * cols, figsize=(10, 1.45 * rows + 0.4), dpi=90, squeeze=False)
    for k, name in enumerate(names):
        befores, afters = results[name]
        starts = {v: r for r, row in enumerate(befores) for v in row}
        for j, (title, values) in enumerate((("before", befores), ("after", afters))):
            ax = axes[k // cols][2 * (k % cols) + j]
            ax.imshow(_origin_colours(values, starts), aspect="auto")
            for r, row in enumerate(values):
                for i, v in enumerate(row):
                    ax.text(i, r, str(v), ha="center", va="center", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks(
                range(len(values)), [f"rank {r}" for r in range(len(values))] if j == 0 else [], fontsize=7
            )
            ax.set_title(f"{name}: {title}", fontsize=8)
    for ax in axes.flat[len(names) * 2 :]:
        ax.axis("off")
    fig.tight_layout()
    return fig
