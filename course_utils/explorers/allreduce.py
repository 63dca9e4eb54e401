"""All-reduce explorer: when is an all-reduce latency-bound, when bandwidth-bound, and which algorithm wins?

Three ways to all-reduce ``n`` bytes over ``w`` ranks, each priced by the modeled cluster's own
network model (``runtime.cluster.network.collective_seconds``; ``alpha``: seconds per message,
``beta``: a link's bandwidth in bytes per second):

    ring   all_reduce (reduce-scatter + all-gather)           2 (w-1) (alpha + n / (w beta))
    tree   reduce, then broadcast (binomial trees)            2 ceil(log2 w) (alpha + n / beta)
    naive  gather to rank 0, then scatter the sum back        2 (w-1) (alpha + n / beta)
           (rank 0's link carries w-1 whole tensors each way)

These are the times ``dist.all_reduce``, ``dist.reduce`` + ``dist.broadcast`` and ``dist.gather``
+ ``dist.scatter`` of whole tensors take on a modeled cluster whose network has that ``alpha`` and
``beta``. The ring's bandwidth term hardly grows with ``w`` (its bus bandwidth is the link's), the
tree's latency term grows only with ``log2 w``: small messages favour the tree, large ones the
ring (NCCL picks between such algorithms by size). ``draw_allreduce`` draws the three against
message size, with modeled points on the same axes.

Taught in chapter 02 (the explorer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from course_utils.runtime.cluster.network import collective_seconds

__all__ = ["ALGORITHMS", "allreduce_seconds", "crossover_bytes", "draw_allreduce", "CONTROLS"]

ALGORITHMS = ("ring", "tree", "naive")

#: The sliders; the defaults are the ``nvlink`` preset (an 8xH100 node: 5 us, 450 GB/s).
CONTROLS = {
    "nbytes": (1024, 2**30, 2**20),  # a power-of-two slider
    "world_size": (2, 64, 1, 8),
    "alpha_us": (1.0, 100.0, 1.0, 5.0),
    "bandwidth_GBps": (1.0, 500.0, 1.0, 450.0),
}


def allreduce_seconds(algorithm: str, nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Modeled time of one all-reduce of ``nbytes`` on ``world_size`` ranks (formulas above).

    ``alpha`` in seconds per message, ``beta`` in bytes per second. One rank moves nothing: 0.
    """
    w, n = world_size, nbytes
    if w < 1 or n < 0 or alpha < 0 or not beta > 0:
        raise ValueError(
            f"need world_size >= 1, nbytes and alpha >= 0, beta > 0; got {w}, {n}, {alpha}, {beta}"
        )
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if w == 1:
        return 0.0
    if algorithm == "ring":
        return collective_seconds("all_reduce", n, w, alpha, beta)
    if algorithm == "tree":
        up, down = ("reduce", n, 0.0), ("broadcast", n, 0.0)
    else:  # naive: rank 0's link carries w - 1 whole tensors in, then w - 1 out
        up, down = ("gather", 0, n), ("scatter", 0, n)
    return sum(collective_seconds(op, nbytes, w, alpha, beta, part) for op, nbytes, part in (up, down))


def crossover_bytes(world_size: int, alpha: float, beta: float) -> float:
    """The message size above which the ring beats the tree (``inf`` where it never does).

    Setting ``2 (w-1) (a + n / (w b)) = 2 L (a + n / b)`` with ``L = ceil(log2 w)`` gives
    ``n = (w-1-L) a b / (L - (w-1)/w)``.
    """
    if world_size < 2:
        return math.inf
    w, levels = world_size, math.ceil(math.log2(world_size))
    denominator = levels - (w - 1) / w
    if denominator <= 0:
        return math.inf
    return max((w - 1 - levels) * alpha * beta / denominator, 0.0)


def draw_allreduce(
    nbytes: int = 2**20,
    world_size: int = 8,
    alpha_us: float = 5.0,
    bandwidth_GBps: float = 450.0,  # noqa: N803 (the unit's capital B)
    modeled: Sequence[tuple[float, float]] = (),
    modeled_label: str = "modeled cluster",
):
    """Time against message size for the three algorithms (log-log), the chosen size marked.

    ``modeled``: ``(nbytes, seconds)`` points from runs on a modeled cluster, drawn on the same axes.
    """
    import matplotlib.pyplot as plt

    alpha, beta = alpha_us * 1e-6, bandwidth_GBps * 1e9
    sizes = [2.0**k for k in range(9, 34)]  # 512 B to 8 GiB
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90, layout="constrained")
    at = {}
    for algorithm, style in zip(ALGORITHMS, ("-", "--", ":"), strict=True):
        ax.loglog(sizes, [allreduce_seconds(algorithm, n, world_size, alpha, beta) for n in sizes], style)
        at[algorithm] = allreduce_seconds(algorithm, nbytes, world_size, alpha, beta)
        ax.plot([nbytes], [at[algorithm]], "o", color=ax.lines[-1].get_color(), label=f"{algorithm}")
    if modeled:
        xs, ys = zip(*modeled, strict=True)
        ax.plot(xs, ys, "k^", label=modeled_label)
    ax.axvline(nbytes, color="0.7", lw=0.8)
    best = min(at, key=at.get)
    cross = crossover_bytes(world_size, alpha, beta)
    cross_text = "never" if math.isinf(cross) else f"{cross / 2**10:,.0f} KiB"
    ax.set_title(
        f"w={world_size}, {alpha_us:g} us, {bandwidth_GBps:g} GB/s, {nbytes / 2**20:g} MiB: "
        f"ring {at['ring'] * 1e6:.4g} us, tree {at['tree'] * 1e6:.4g} us, naive {at['naive'] * 1e6:.4g} us; "
        f"fastest: {best}; ring beats tree above {cross_text}",
        fontsize=8,
    )
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce time (s)")
    ax.legend(fontsize=8)
    return fig
