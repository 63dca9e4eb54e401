"""How often to checkpoint: Young and Daly's interval, ``sqrt(2 * C * M)``, and what a restart costs.

Notation: a save stops training for ``C`` seconds every ``tau`` seconds of work; failures come
at random, one every ``M`` seconds on average (exponentially distributed gaps); after each one
the job spends ``R`` seconds before it trains again (requeue, rendezvous, loading the
checkpoint), then redoes the work since its last complete checkpoint. The *overhead* is the
time beyond the useful work, per second of useful work: ``wall / useful - 1``.

* :func:`young_daly_interval`: ``sqrt(2 C M)``, the interval that minimises the first-order
  overhead (Young 1974, Daly 2006).
* :func:`first_order_overhead`: ``C / tau + (tau / 2 + C + R) / M``: saving costs ``C / tau``;
  each failure costs the restart ``R``, the lost work (about ``tau / 2``) and the save (``C``).
* :func:`expected_overhead`: the exact expectation of that model (Daly 2006, eq. 13, with failures
  also during saves and restarts): ``M e^(R/M) (e^((tau+C)/M) - 1) / tau - 1``.
* :func:`best_interval`: the ``tau`` that minimises :func:`expected_overhead`. ``R`` only
  multiplies it by ``e^(R/M)``, so the best interval does not depend on ``R``; the overhead does.
* :func:`simulate_overhead`: the same job run on seeded random failures, to check the formulas.

Taught in chapter 08 (section 6, how often to checkpoint) and appendix 08b (the restart cost).
"""

from __future__ import annotations

import math
import random

__all__ = [
    "young_daly_interval",
    "first_order_overhead",
    "expected_overhead",
    "best_interval",
    "simulate_overhead",
]


def _check(save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0) -> None:
    if save_seconds <= 0 or mtbf_seconds <= 0 or restart_seconds < 0:
        raise ValueError(
            "save_seconds and mtbf_seconds must be positive and restart_seconds not negative, got "
            f"{save_seconds}, {mtbf_seconds}, {restart_seconds}"
        )


def young_daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """How often to checkpoint: ``sqrt(2 * C * M)`` seconds between checkpoints (Young 1974, Daly 2006).

    Saving every ``tau`` seconds costs ``C / tau`` of the time; a failure, every ``M`` seconds
    on average, loses ``tau / 2`` of work on average, ``tau / (2 M)`` of the time. The sum is
    smallest at ``tau = sqrt(2 C M)`` (first order, for ``C`` much smaller than ``M``).
    """
    if save_seconds <= 0 or mtbf_seconds <= 0:
        raise ValueError(
            f"save_seconds and mtbf_seconds must be positive, got {save_seconds}, {mtbf_seconds}"
        )
    return (2.0 * save_seconds * mtbf_seconds) ** 0.5


def first_order_overhead(
    interval: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0
) -> float:
    """``C / tau + (tau / 2 + C + R) / M``: the overhead, to first order in ``tau / M``, ``C / M``
    and ``R / M``."""
    _check(save_seconds, mtbf_seconds, restart_seconds)
    tau, C, M, R = interval, save_seconds, mtbf_seconds, restart_seconds
    return C / tau + (tau / 2 + C + R) / M


def expected_overhead(
    interval: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0
) -> float:
    """The exact expected overhead: ``M e^(R/M) (e^((tau+C)/M) - 1) / tau - 1``.

    Each segment of ``tau + C`` seconds must run without a failure; the expected time until one
    does, when every failure costs a restart of ``R`` (which must itself run without one), is
    ``M e^(R/M) (e^((tau+C)/M) - 1)`` (Daly 2006)."""
    _check(save_seconds, mtbf_seconds, restart_seconds)
    if interval <= 0:
        raise ValueError(f"interval must be positive, got {interval}")
    tau, C, M, R = interval, save_seconds, mtbf_seconds, restart_seconds
    return M * math.exp(R / M) * math.expm1((tau + C) / M) / tau - 1.0


def best_interval(save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """The interval that minimises :func:`expected_overhead` (golden-section search, to 1e-9
    relative). The result is the same for every ``restart_seconds``: see the module's docstring."""
    _check(save_seconds, mtbf_seconds, restart_seconds)
    low, high = 1e-6 * save_seconds, 10.0 * mtbf_seconds + save_seconds

    def cost(tau: float) -> float:
        return expected_overhead(tau, save_seconds, mtbf_seconds, restart_seconds)

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    while high - low > 1e-9 * high:
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if cost(a) < cost(b):
            high = b
        else:
            low = a
    return (low + high) / 2.0


def simulate_overhead(
    interval: float,
    save_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float = 0.0,
    *,
    work_seconds: float,
    seed: int = 0,
) -> dict:
    """Run the model's job once on seeded random failures (``random.Random(seed)``: the same
    numbers on every machine) until it has done ``work_seconds`` of useful work.

    Each segment (``interval`` of work, then a save of ``save_seconds``; the last one shorter)
    is tried until it runs without a failure; a failure loses the segment so far and costs a
    restart, itself tried until it runs without one. Returns ``{"overhead"`` (``wall / work -
    1``), ``"failures"``, ``"wall_seconds"}``."""
    _check(save_seconds, mtbf_seconds, restart_seconds)
    if interval <= 0 or work_seconds <= 0:
        raise ValueError(f"interval and work_seconds must be positive, got {interval}, {work_seconds}")
    rng = random.Random(seed)

    def next_failure() -> float:  # an exponential gap of mean M (memoryless: drawn afresh)
        return -mtbf_seconds * math.log(1.0 - rng.random())

    wall, failures, left = 0.0, 0, work_seconds
    while left > 0:
        segment = min(interval, left) + save_seconds
        while (gap := next_failure()) < segment:
            wall, failures = wall + gap, failures + 1
            while (gap := next_failure()) < restart_seconds:  # a failure during the restart
                wall, failures = wall + gap, failures + 1
            wall += restart_seconds
        wall += segment
        left -= min(interval, left)
    return {"overhead": wall / work_seconds - 1.0, "failures": failures, "wall_seconds": wall}
