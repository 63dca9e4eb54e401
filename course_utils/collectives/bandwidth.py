"""How fast an all-reduce is: timing it, its algorithm and bus bandwidth, the alpha-beta model.

Two bandwidths, as nccl-tests defines them, for an all-reduce of ``n`` bytes
that takes ``t`` seconds on ``w`` ranks:

* algorithm bandwidth ``algbw = n / t``: how fast *your* tensor got reduced;
* bus bandwidth ``busbw = algbw * 2 (w - 1) / w``: the rate each rank's link
  actually carried, since a ring all-reduce makes every rank send (and
  receive) ``2 (w - 1) / w * n`` bytes. It does not depend on ``w`` for an
  ideal ring, so it compares runs of different sizes, and it is the number to
  hold against the link's speed.

The **alpha-beta model** of the ring: ``2 (w - 1)`` steps, each paying a fixed
latency ``alpha`` plus ``n / w`` bytes at ``beta`` seconds per byte::

    t(n) = 2 (w - 1) * alpha + 2 (w - 1) / w * n * beta

Small messages pay mostly ``alpha`` (latency-bound), large ones mostly
``beta`` (bandwidth-bound); the bus bandwidth tends to ``1 / beta``.

Taught in chapter 02 (section 6, bandwidth against message size).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_utils.runtime.hardware import rank_device
from course_utils.runtime.timing import Stopwatch


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """Bytes per second of the all-reduced tensor: ``nbytes / seconds``."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    return nbytes / seconds


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """Bytes per second each rank's link carried in a ring all-reduce: ``algbw * 2 (w - 1) / w``."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size!r}")
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


def time_all_reduce(
    all_reduce, nbytes: int, repeats: int = 5, group=None, warm_up: bool = True, max_calls: int = 50
) -> list[float]:
    """Seconds per call of ``all_reduce(tensor)`` on a float32 tensor of ``nbytes``; run on every rank.

    Each repeat starts the ranks together (a barrier), runs enough calls to last
    a few milliseconds (more for small messages, at most ``max_calls``), and keeps the slowest rank's
    time per call, so every rank returns the same list of ``repeats`` figures.
    The tensor is on the rank's device (its GPU under NCCL); ``warm_up`` first
    runs one untimed call (connections, first use of the memory).
    """
    device = rank_device()
    t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)  # zeros stay zeros when summed
    calls = max(1, min(max_calls, (4 << 20) // max(nbytes, 1)))
    if warm_up:
        all_reduce(t, group=group)
    seconds = []
    for _ in range(repeats):
        dist.barrier(group=group)
        with Stopwatch(device) as watch:  # synced at both ends: a GPU collective returns before it is done
            for _ in range(calls):
                all_reduce(t, group=group)
        slowest = torch.tensor([watch.seconds / calls], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        seconds.append(slowest.item())
    return seconds


def sweep(
    implementations: dict, sizes: list[int], repeats: int = 5, group=None, max_calls: int = 50
) -> list[dict]:
    """Time each all-reduce implementation at each size; run on every rank.

    implementations: ``{name: fn(tensor, group=None)}``, e.g. ``dist.all_reduce``
    and ``ring_all_reduce``. Implementations alternate repeat by repeat, so a
    busy moment on the machine hurts them alike. Returns one row per
    (name, size): ``name, nbytes, world_size, seconds`` (the median),
    ``algbw`` and ``busbw`` (bytes per second).
    """
    w = dist.get_world_size(group)
    rows = []
    for nbytes in sizes:
        times = {name: [] for name in implementations}
        for i in range(repeats):
            for name, fn in implementations.items():
                times[name] += time_all_reduce(
                    fn, nbytes, repeats=1, group=group, warm_up=i == 0, max_calls=max_calls
                )
        for name, ts in times.items():
            t = statistics.median(ts)
            rows.append(
                {
                    "name": name,
                    "nbytes": nbytes,
                    "world_size": w,
                    "seconds": t,
                    "algbw": algorithm_bandwidth(nbytes, t),
                    "busbw": bus_bandwidth(nbytes, t, w),
                }
            )
    return rows


@dataclass(frozen=True)
class AlphaBeta:
    """The ring's cost model ``t(n) = 2 (w-1) alpha + 2 (w-1)/w n beta`` for ``w`` ranks."""

    alpha: float  # seconds per step (latency)
    beta: float  # seconds per byte (1 / bandwidth)
    world_size: int

    def seconds(self, nbytes: float) -> float:
        w = self.world_size
        return 2 * (w - 1) * self.alpha + 2 * (w - 1) / w * nbytes * self.beta

    def latency_share(self, nbytes: float) -> float:
        """Fraction of the predicted time that is latency (alpha): near 1 for small messages."""
        return 2 * (self.world_size - 1) * self.alpha / self.seconds(nbytes)

    def busbw(self, nbytes: float) -> float:
        """Predicted bus bandwidth (bytes/s); tends to ``1 / beta`` for large messages."""
        return bus_bandwidth(nbytes, self.seconds(nbytes), self.world_size)

    @property
    def peak_busbw(self) -> float:
        """The bus bandwidth large messages approach, ``1 / beta`` (bytes/s); ``inf`` if ``beta`` is 0."""
        return math.inf if self.beta == 0 else 1 / self.beta

    @property
    def half_bandwidth_bytes(self) -> float:
        """The message size at which latency and bandwidth terms are equal (busbw = half its peak);
        ``inf`` if ``beta`` is 0 (the latency term is then all there is)."""
        return math.inf if self.beta == 0 else self.world_size * self.alpha / self.beta


def fit_alpha_beta(nbytes: list[float], seconds: list[float], world_size: int) -> AlphaBeta:
    """Least-squares fit of the ring model to measured times, in *relative* error.

    Relative error weighs a 100-microsecond message as much as a 100-millisecond one
    (plain least squares would fit only the large ones). Neither term can be negative:
    where the free fit gives one a negative value (noisy times that do not grow with
    the size), that term is set to 0 and the other is fitted alone, whichever of the two
    such fits is closer (non-negative least squares, exact for two unknowns). Raises
    ``ValueError`` with fewer than two sizes or for a world of one rank (nothing to
    communicate).
    """
    if world_size < 2:
        raise ValueError("the alpha-beta model needs world_size >= 2 (one rank sends nothing)")
    if len(nbytes) != len(seconds) or len(set(nbytes)) < 2:
        raise ValueError("need times for at least two different message sizes, one time per size")
    w = world_size
    design = torch.tensor([[2.0 * (w - 1), 2.0 * (w - 1) / w * n] for n in nbytes], dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64)
    weights = (1 / t).unsqueeze(1)
    a, target = design * weights, torch.ones_like(t)  # a: [sizes, 2]; model / time should be 1
    alpha, beta = torch.linalg.lstsq(a, target.unsqueeze(1)).solution.squeeze(1).tolist()
    if alpha < 0 or beta < 0:
        one_term = []  # (squared error, alpha, beta), one column's coefficient each; both positive
        for column in (0, 1):
            x = a[:, column]
            coefficient = float(x @ target / (x @ x))
            error = float(((coefficient * x - target) ** 2).sum())
            one_term.append((error, coefficient if column == 0 else 0.0, coefficient if column == 1 else 0.0))
        _, alpha, beta = min(one_term)
    return AlphaBeta(alpha, beta, w)


def plot(rows: list[dict], fits: dict | None = None, title: str = ""):
    """Bus bandwidth (GB/s) against message size, one line per implementation; fitted models dashed."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=90)
    names = list(dict.fromkeys(r["name"] for r in rows))
    for k, name in enumerate(names):
        mine = sorted((r for r in rows if r["name"] == name), key=lambda r: r["nbytes"])
        x = [r["nbytes"] for r in mine]
        ax.plot(x, [r["busbw"] / 1e9 for r in mine], "o-", color=f"C{k}", label=f"{name} (measured)")
        if fits and name in fits:
            dense = torch.logspace(math.log10(x[0]), math.log10(x[-1]), 60, dtype=torch.float64).tolist()
            ax.plot(
                dense,
                [fits[name].busbw(n) / 1e9 for n in dense],
                "--",
                color=f"C{k}",
                label=f"{name}, alpha-beta fit",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # latency-bound: a straight rise; bandwidth-bound: flat
    ticks = sorted({r["nbytes"] for r in rows})
    ax.set_xticks(ticks, [_size_label(n) for n in ticks], fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _size_label(nbytes: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes:g} B"
