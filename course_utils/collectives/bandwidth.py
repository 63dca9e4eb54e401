"""How fast an all-reduce is: timing it, its algorithm and bus bandwidth, the alpha-beta model.

Two bandwidths, as nccl-tests defines them, for an all-reduce of ``n`` bytes
that takes ``t`` seconds on ``w`` ranks:

* algorithm bandwidth ``algbw = n / t``: how fast *your* tensor got reduced;
* bus bandwidth ``busbw = algbw * 2 (w - 1) / w``: the rate each rank's link
  actually carried, since a ring all-reduce makes every rank send (and
  receive) ``2 (w - 1) / w * n`` bytes. It does not depend on ``w`` for an
  ideal ring, so it compares runs of different sizes, and it is the number to
  hold against the link's speed.

The **alpha-beta model** of the ring, in the modeled network's units (``alpha``: seconds of
latency per message, ``beta``: the link's bandwidth in bytes per second): ``2 (w - 1)`` steps,
each paying ``alpha`` plus ``n / w`` bytes at ``beta``::

    t(n) = 2 (w - 1) * (alpha + n / (w * beta))

Small messages pay mostly ``alpha`` (latency-bound), large ones mostly ``n / beta``
(bandwidth-bound); the bus bandwidth tends to ``beta``, and reaches half of it at
``n = w * alpha * beta``.

``time_all_reduce`` and ``sweep`` read the course's clock (``runtime.timing``): wall time on real
devices (``python -m course_utils.scripts.gpu_report`` on GPUs), and the modeled GPU's virtual
time in a rank of a modeled cluster (``launch(fn, cluster=...)``), where every figure is exact.
There, ``device="meta"`` sweeps real sizes (gigabytes) without allocating them.

Taught in chapter 02 (appendix 02b, section 2d, bandwidth against message size).
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
    all_reduce,
    nbytes: int,
    repeats: int = 5,
    group=None,
    warm_up: bool = True,
    max_calls: int = 50,
    device: torch.device | str | None = None,
) -> list[float]:
    """Seconds per call of ``all_reduce(tensor)`` on a float32 tensor of ``nbytes``; run on every rank.

    Each repeat starts the ranks together (a barrier), runs enough calls to last
    a few milliseconds (more for small messages, at most ``max_calls``), and keeps the slowest rank's
    time per call, so every rank returns the same list of ``repeats`` figures.
    The tensor is on ``device`` (default: the rank's device, its GPU under NCCL; ``"meta"`` in a
    modeled cluster: real sizes, nothing allocated); ``warm_up`` first runs one untimed call
    (connections, first use of the memory).
    """
    mine = rank_device()
    t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device or mine)  # zeros stay zeros
    calls = max(1, min(max_calls, (4 << 20) // max(nbytes, 1)))
    if warm_up:
        all_reduce(t, group=group)
    seconds = []
    for _ in range(repeats):
        dist.barrier(group=group)
        with Stopwatch(mine) as watch:  # synced at both ends: a GPU collective returns before it is done
            for _ in range(calls):
                all_reduce(t, group=group)
        slowest = torch.tensor([watch.seconds / calls], dtype=torch.float64, device=mine)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        seconds.append(slowest.item())
    return seconds


def sweep(
    implementations: dict,
    sizes: list[int],
    repeats: int = 5,
    group=None,
    max_calls: int = 50,
    device: torch.device | str | None = None,
) -> list[dict]:
    """Time each all-reduce implementation at each size; run on every rank.

    implementations: ``{name: fn(tensor, group=None)}``, e.g. ``dist.all_reduce``
    and ``ring_all_reduce``. Implementations alternate repeat by repeat, so a
    busy moment on the machine hurts them alike. ``device``: where the tensors live
    (``time_all_reduce``). Returns one row per (name, size): ``name, nbytes, world_size,
    seconds`` (the median), ``algbw`` and ``busbw`` (bytes per second).
    """
    w = dist.get_world_size(group)
    rows = []
    for nbytes in sizes:
        times = {name: [] for name in implementations}
        for i in range(repeats):
            for name, fn in implementations.items():
                times[name] += time_all_reduce(
                    fn, nbytes, repeats=1, group=group, warm_up=i == 0, max_calls=max_calls, device=device
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
    """The ring's cost model ``t(n) = 2 (w-1) (alpha + n / (w beta))`` for ``w`` ranks."""

    alpha: float  # seconds per step (latency)
    beta: float  # bytes per second (the link's bandwidth); inf: bytes cost nothing
    world_size: int

    def seconds(self, nbytes: float) -> float:
        w = self.world_size
        return 2 * (w - 1) * (self.alpha + nbytes / (w * self.beta))

    def latency_share(self, nbytes: float) -> float:
        """Fraction of the predicted time that is latency (alpha): near 1 for small messages."""
        return 2 * (self.world_size - 1) * self.alpha / self.seconds(nbytes)

    def busbw(self, nbytes: float) -> float:
        """Predicted bus bandwidth (bytes/s); tends to ``beta`` for large messages."""
        return bus_bandwidth(nbytes, self.seconds(nbytes), self.world_size)

    @property
    def peak_busbw(self) -> float:
        """The bus bandwidth large messages approach: ``beta`` (bytes/s)."""
        return self.beta

    @property
    def half_bandwidth_bytes(self) -> float:
        """The message size at which latency and bandwidth terms are equal (busbw = half its peak),
        ``w alpha beta``; ``inf`` if bytes cost nothing (the latency term is then all there is)."""
        return math.inf if math.isinf(self.beta) else self.world_size * self.alpha * self.beta


def fit_alpha_beta(nbytes: list[float], seconds: list[float], world_size: int) -> AlphaBeta:
    """Least-squares fit of the ring model to measured times, in *relative* error.

    Relative error weighs a 100-microsecond message as much as a 100-millisecond one
    (plain least squares would fit only the large ones). Neither term can be negative:
    where the free fit gives one a negative value (noisy times that do not grow with
    the size), that term is set to 0 and the other is fitted alone, whichever of the two
    such fits is closer (non-negative least squares, exact for two unknowns): no bandwidth
    term is an infinite ``beta``. Raises ``ValueError`` with fewer than two sizes or for a
    world of one rank (nothing to communicate).
    """
    if world_size < 2:
        raise ValueError("the alpha-beta model needs world_size >= 2 (one rank sends nothing)")
    if len(nbytes) != len(seconds) or len(set(nbytes)) < 2:
        raise ValueError("need times for at least two different message sizes, one time per size")
    w = world_size
    # unknowns: alpha (s) and 1 / beta (s per byte), both linear in t
    design = torch.tensor([[2.0 * (w - 1), 2.0 * (w - 1) / w * n] for n in nbytes], dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64)
    weights = (1 / t).unsqueeze(1)
    a, target = design * weights, torch.ones_like(t)  # a: [sizes, 2]; model / time should be 1
    alpha, per_byte = torch.linalg.lstsq(a, target.unsqueeze(1)).solution.squeeze(1).tolist()
    if alpha < 0 or per_byte < 0:
        one_term = []  # (squared error, alpha, seconds per byte), one column's coefficient each
        for column in (0, 1):
            x = a[:, column]
            coefficient = float(x @ target / (x @ x))
            error = float(((coefficient * x - target) ** 2).sum())
            one_term.append((error, coefficient if column == 0 else 0.0, coefficient if column == 1 else 0.0))
        _, alpha, per_byte = min(one_term)
    return AlphaBeta(alpha, math.inf if per_byte == 0 else 1 / per_byte, w)


def plot(rows: list[dict], fits: dict | None = None, title: str = "", timed: str = "measured"):
    """Bus bandwidth (GB/s) against message size, one line per implementation (``timed``: how its
    times were taken, for the legend); each fitted model dashed, with its ``beta`` dotted."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=90)
    names = list(dict.fromkeys(r["name"] for r in rows))
    for k, name in enumerate(names):
        mine = sorted((r for r in rows if r["name"] == name), key=lambda r: r["nbytes"])
        x = [r["nbytes"] for r in mine]
        ax.plot(x, [r["busbw"] / 1e9 for r in mine], "o-", color=f"C{k}", label=f"{name} ({timed})")
        if fits and name in fits:
            fit = fits[name]
            dense = torch.logspace(math.log10(x[0]), math.log10(x[-1]), 60, dtype=torch.float64).tolist()
            ax.plot(dense, [fit.busbw(n) / 1e9 for n in dense], "--", color=f"C{k}", label="alpha-beta fit")
            if math.isfinite(fit.beta):
                label = f"beta = {fit.beta / 1e9:.4g} GB/s"
                ax.axhline(fit.beta / 1e9, ls=":", lw=1, color=f"C{k}", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # latency-bound: a straight rise; bandwidth-bound: flat
    ticks = sorted({r["nbytes"] for r in rows})
    step = max(1, len(ticks) // 12)
    ax.set_xticks(ticks[::step], [size_label(n) for n in ticks[::step]], fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def size_label(nbytes: float) -> str:
    """A size in binary units: ``size_label(8 << 30) == "8 GiB"``, ``size_label(512) == "512 B"``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes:g} B"
