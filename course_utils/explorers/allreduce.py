"""All-reduce explorer: when is an all-reduce latency-bound, when bandwidth-bound, and which algorithm wins?

Three ways to all-reduce ``n`` bytes over ``w`` ranks, in the alpha-beta model (``alpha``: seconds
per message, ``beta``: seconds per byte on one link, every rank sending and receiving at once):

    ring   (chapter 02, reduce-scatter + all-gather)   2 (w-1) alpha + 2 (w-1)/w n beta
    tree   (reduce up a binary tree, broadcast down)   2 ceil(log2 w) (alpha + n beta)
    naive  (all to rank 0, rank 0 sends the sum back)  2 (w-1) (alpha + n beta)

The ring's bandwidth term hardly grows with ``w`` (its bus bandwidth is the link's), the tree's
latency term grows only with ``log2 w``: small messages favour the tree, large ones the ring (NCCL
picks between such algorithms by size). ``draw_allreduce`` draws the three against message size,
with times measured on this machine on the same axes.

Taught in chapter 02 (the explorer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ALGORITHMS", "allreduce_seconds", "crossover_bytes", "draw_allreduce", "CONTROLS"]

ALGORITHMS = ("ring", "tree", "naive")

CONTROLS = {
    "nbytes": (1024, 2**30, 2**20),  # a power-of-two slider
    "world_size": (2, 64, 1, 4),
    "alpha_us": (1.0, 1000.0, 1.0, 100.0),
    "beta_ns": (0.01, 10.0, 0.01, 1.0),
}


def allreduce_seconds(algorithm: str, nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Predicted time of one all-reduce of ``nbytes`` on ``world_size`` ranks (formulas above).

    ``alpha`` in seconds per message, ``beta`` in seconds per byte. One rank moves nothing: 0.
    """
    w, n = world_size, nbytes
    if w < 1 or n < 0 or alpha < 0 or beta < 0:
        raise ValueError(f"need world_size >= 1 and nbytes, alpha, beta >= 0; got {w}, {n}, {alpha}, {beta}")
    if w == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (w - 1) * alpha + 2 * (w - 1) / w * n * beta
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(w)) * (alpha + n * beta)
    if algorithm == "naive":
        return 2 * (w - 1) * (alpha + n * beta)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def crossover_bytes(world_size: int, alpha: float, beta: float) -> float:
    """The message size above which the ring beats the tree (``inf`` where it never does).

    Setting ``2 (w-1) a + 2 (w-1)/w n b = 2 L (a + n b)`` with ``L = ceil(log2 w)`` gives
    ``n = (w-1-L) a / ((L - (w-1)/w) b)``.
    """
    w, levels = world_size, math.ceil(math.log2(world_size))
    denominator = (levels - (w - 1) / w) * beta
    if denominator <= 0:
        return math.inf
    return max((w - 1 - levels) * alpha / denominator, 0.0)


def draw_allreduce(
    nbytes: int = 2**20,
    world_size: int = 4,
    alpha_us: float = 100.0,
    beta_ns: float = 1.0,
    measured: Sequence[tuple[float, float]] = (),
    measured_label: str = "measured here",
):
    """Time against message size for the three algorithms (log-log), the chosen size marked.

    ``measured``: ``(nbytes, seconds)`` points measured on this machine, drawn on the same axes.
    """
    import matplotlib.pyplot as plt

    alpha, beta = alpha_us * 1e-6, beta_ns * 1e-9
    sizes = [2.0**k for k in range(10, 31)]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90, layout="constrained")
    at = {}
    for algorithm, style in zip(ALGORITHMS, ("-", "--", ":"), strict=True):
        ax.loglog(sizes, [allreduce_seconds(algorithm, n, world_size, alpha, beta) for n in sizes], style)
        at[algorithm] = allreduce_seconds(algorithm, nbytes, world_size, alpha, beta)
        ax.plot([nbytes], [at[algorithm]], "o", color=ax.lines[-1].get_color(), label=f"{algorithm}")
    if measured:
        xs, ys = zip(*measured, strict=True)
        ax.plot(xs, ys, "k^", label=measured_label)
    ax.axvline(nbytes, color="0.7", lw=0.8)
    best = min(at, key=at.get)
    cross = crossover_bytes(world_size, alpha, beta)
    cross_text = "never" if math.isinf(cross) else f"{cross / 2**10:,.0f} KiB"
    ax.set_title(
        f"w={world_size}, {nbytes / 2**20:g} MiB: ring {at['ring'] * 1e3:.3g} ms, "
        f"tree {at['tree'] * 1e3:.3g} ms, naive {at['naive'] * 1e3:.3g} ms; fastest: {best}; "
        f"ring beats tree above {cross_text}",
        fontsize=8,
    )
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce time (s)")
    ax.legend(fontsize=8)
    return fig
