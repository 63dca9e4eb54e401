"""Pipeline schedules as data: which action each device runs, in which order.

Notation (the course's): ``F(n,m)`` is the forward of stage ``n`` on micro-batch
``m``, ``B(n,m)`` its backward, and, where the backward is split in two (zero
bubble), ``B(n,m)`` computes only the *input* gradient (what stage ``n-1`` waits
for) and ``W(n,m)`` the *weight* gradient (what nobody waits for). Stages and
micro-batches count from 0. A schedule for ``p`` devices, ``m`` micro-batches and
``v`` stages per device (``v > 1`` only for interleaved 1F1B) is, per device, an
ordered list of actions; stage ``n`` lives on device ``n % p``.

    gpipe(p, m)               all forwards, then all backwards
    one_f_one_b(p, m)         warm up with p-1-d forwards, then alternate F and B
    interleaved_1f1b(p, m, v) 1F1B over v smaller stages per device (Megatron-LM)
    zero_bubble_h1(p, m)      1F1B with W deferred into the bubbles (Qi et al., ICLR 2024)
    zero_bubble_h2(p, m)      more warm-up forwards, W pushed to the end: a parallelogram

``Schedule.kind`` ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1", ..., a ``ScheduleKind``) says which
it is; ``SCHEDULE_KINDS`` maps a kind to its builder, display name (``kind.title``) and torch class.

``course_utils.pipeline.validate`` checks a schedule.

Taught in chapter 06 (sections 2 to 6, the schedules) and appendix 06b (section 1, ZB-H2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from course_utils.runtime.checks import check_whole

ACTION_KINDS = ("F", "B", "W")


class ScheduleKind(str, Enum):
    """Which schedule: equal to its string value (``ScheduleKind("1f1b") == "1f1b"``), so
    either may be passed where a kind is expected. ``title`` is its display name."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"
    ZERO_BUBBLE_H1 = "zero_bubble_h1"
    ZERO_BUBBLE_H2 = "zero_bubble_h2"
    ZB_V = "zb_v"  # torch's ScheduleZBVZeroBubble, read by ``from_torch``
    INTERLEAVED_ZB = "interleaved_zb"  # torch's ScheduleInterleavedZeroBubble, read by ``from_torch``
    DUALPIPE_V = "dualpipe_v"  # torch's ScheduleDualPipeV, read by ``from_torch``

    def __str__(self) -> str:
        return self.value

    @property
    def title(self) -> str:  # shadows str.title: the display name, e.g. "1F1B"
        return (SCHEDULE_KINDS.get(self) or TORCH_ONLY_TITLES[self]).title


class Action(NamedTuple):
    """One unit of work: ``kind`` F, B or W, on ``stage`` n, for ``microbatch`` m."""

    kind: str
    stage: int
    microbatch: int

    def __repr__(self) -> str:
        return f"{self.kind}({self.stage},{self.microbatch})"

    __str__ = __repr__


@dataclass(frozen=True)
class Schedule:
    """Per device (``devices[d]``), the ordered actions it runs.

    p devices, m micro-batches, v stages per device (p * v stages in all; stage n on device n % p,
    unless ``placement`` gives each stage's device, e.g. ZB-V's "V": 0 1 .. p-1 p-1 .. 1 0).
    ``split_backward``: B is the input gradient only and a separate W computes the weight gradient.
    ``kind``: a ``ScheduleKind`` or its string value; ``name``: its display name, e.g. "1F1B".
    """

    kind: ScheduleKind
    p: int
    m: int
    v: int
    devices: tuple
    split_backward: bool = False
    placement: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "kind", ScheduleKind(self.kind))

    @property
    def name(self) -> str:
        return self.kind.title

    @property
    def num_stages(self) -> int:
        return self.p * self.v

    def device_of(self, stage: int) -> int:
        return self.placement[stage] if self.placement else stage % self.p

    def __str__(self) -> str:
        head = f"{self.name}: p={self.p} devices, m={self.m} micro-batches, {self.num_stages} stages"
        return "\n".join(
            [head] + [f"  device {d}: " + " ".join(map(str, acts)) for d, acts in enumerate(self.devices)]
        )


def _check_enough_microbatches(schedule: str, p: int, m: int) -> None:
    if m < p:
        raise ValueError(
            f"{schedule} needs at least as many micro-batches as devices (m >= p), got m={m}, p={p}: "
            f"this construction gives device d exactly p-1-d warm-up forwards (Megatron-LM caps them "
            f"at m instead; torch's Schedule1F1B refuses m < p too). Use m >= {p}, or gpipe({p}, {m})."
        )


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: each device runs F for all m micro-batches, then B for all of them.

    Every device holds all m micro-batches' activations at its peak.
    """
    check_whole("p", p)
    check_whole("m", m)
    devices = tuple(
        tuple([Action("F", d, j) for j in range(m)] + [Action("B", d, j) for j in range(m)]) for d in range(p)
    )
    return Schedule(ScheduleKind.GPIPE, p, m, 1, devices)


def one_f_one_b_order(p: int, m: int, d: int) -> list[tuple[str, int]]:
    """Device d's 1F1B order as (kind, micro-batch): p-1-d warm-up forwards, then
    F(w+i), B(i) pairs, then the remaining backwards (cool-down)."""
    warmup = p - 1 - d
    order = [("F", j) for j in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", j) for j in range(m - warmup, m)]


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush): warm up, then one forward, one backward.

    Device d starts p-1-d forwards, then alternates, so it never holds more
    than p-d micro-batches' activations; the bubble equals GPipe's. Needs m >= p.
    """
    check_whole("p", p)
    check_whole("m", m)
    _check_enough_microbatches("one_f_one_b", p, m)
    devices = tuple(tuple(Action(kind, d, j) for kind, j in one_f_one_b_order(p, m, d)) for d in range(p))
    return Schedule(ScheduleKind.ONE_F_ONE_B, p, m, 1, devices)


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): each device holds v stages, n = d, d+p, .., d+(v-1)p.

    Micro-batches go round in groups of p: the k-th forward on a device runs
    chunk (k // p) % v on micro-batch (k // pv) p + k % p; backwards run the
    chunks in reverse. Device d warms up with 2(p-1-d) + (v-1)p forwards. The
    bubble shrinks v times: (p-1)/(vm+p-1) of the device time. This construction (the
    Megatron-LM paper's) needs m a multiple of p; torch's ``ScheduleInterleaved1F1B`` relaxes
    that (m a multiple of its number of rounds, ``max(1, m // p)``).
    """
    check_whole("p", p)
    check_whole("m", m)
    check_whole("v", v)
    if v == 1:
        return one_f_one_b(p, m)
    _check_enough_microbatches("interleaved_1f1b", p, m)
    if m % p:
        raise ValueError(
            f"interleaved_1f1b needs m to be a multiple of p (this construction, the Megatron-LM paper's, "
            f"sends micro-batches round the devices in groups of p), got m={m}, p={p}: use m={m - m % p} or "
            f"m={m - m % p + p} (torch's ScheduleInterleaved1F1B accepts more m)"
        )
    devices = []
    total = m * v

    def stage_and_microbatch(d: int, k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        return (v - 1 - chunk if backward else chunk) * p + d, (k // (p * v)) * p + k % p

    for d in range(p):
        warmup = min(2 * (p - 1 - d) + (v - 1) * p, total)
        order = [("F", k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", k) for k in range(total - warmup, total)]
        devices.append(tuple(Action(kind, *stage_and_microbatch(d, k, kind == "B")) for kind, k in order))
    return Schedule(ScheduleKind.INTERLEAVED_1F1B, p, m, v, tuple(devices))


def zero_bubble_h1(p: int, m: int) -> Schedule:
    """ZB-H1: 1F1B with each backward split into B (input gradient) and W (weight gradient).

    Nobody waits for W, so device d postpones its first d weight gradients
    (one W per step after that) and runs the rest at the end, where 1F1B idles.
    Every device then holds up to p micro-batches (1F1B's device 0 peak), and
    the bubble falls from (p-1)(F+B+W) to (p-1)(F+B-W). Needs m >= p.
    """
    check_whole("p", p)
    check_whole("m", m)
    _check_enough_microbatches("zero_bubble_h1", p, m)
    devices = []
    for d in range(p):
        order, next_w, backwards = [], 0, 0
        for kind, j in one_f_one_b_order(p, m, d):
            order.append(Action(kind, d, j))
            if kind == "B":
                backwards += 1
                if backwards > d:  # after the first d backwards: one W per B
                    order.append(Action("W", d, next_w))
                    next_w += 1
        order += [Action("W", d, j) for j in range(next_w, m)]
        devices.append(tuple(order))
    return Schedule(ScheduleKind.ZERO_BUBBLE_H1, p, m, 1, tuple(devices), split_backward=True)


def zero_bubble_h2(p: int, m: int) -> Schedule:
    """ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.2).

    The paper draws it by hand for F = B = W; this builds the same shape by one rule, run
    at unit costs: at each time unit every device runs the first of these that is ready,
    B (its gradient has arrived), F (while it holds fewer than 2p-1 micro-batches), W.
    Device 0 warms up with 2p-1 forwards, so every device holds up to 2p-1 micro-batches
    (the paper's (2p-1) M_B, about twice 1F1B's p); the last devices push their W to the
    end of the step. Device d is then busy without a gap from time d to d + 3m: the step is
    a parallelogram, whose idle corners a next step can fill only if no synchronization
    ends this one (``repeat_steps``). Needs m >= 2p-1.
    """
    check_whole("p", p)
    check_whole("m", m)
    if m < 2 * p - 1:
        raise ValueError(
            f"zero_bubble_h2 needs m >= 2p-1 micro-batches (device 0 warms up with 2p-1 forwards), "
            f"got m={m}, p={p}: use m >= {2 * p - 1}, or zero_bubble_h1({p}, {m})"
        )
    done_at: dict[Action, int] = {}  # action -> the time unit at whose end it finished
    orders: list[list[Action]] = [[] for _ in range(p)]
    count = [{"F": 0, "B": 0, "W": 0} for _ in range(p)]  # per device, actions run so far
    t = 0
    while any(c["W"] < m for c in count):
        for d, c in enumerate(count):
            candidates = {  # kind -> (the action, what it needs, may it run at all)
                "B": (
                    Action("B", d, c["B"]),
                    [Action("F", d, c["B"]), Action("B", d + 1, c["B"])],
                    c["B"] < c["F"],
                ),
                "F": (
                    Action("F", d, c["F"]),
                    [Action("F", d - 1, c["F"])],
                    c["F"] < m and c["F"] - c["W"] < 2 * p - 1,
                ),
                "W": (Action("W", d, c["W"]), [Action("B", d, c["W"])], c["W"] < c["B"]),
            }
            for kind in "BFW":
                action, needs, allowed = candidates[kind]
                needs = [a for a in needs if 0 <= a.stage < p]
                if allowed and all(done_at.get(a, t) < t for a in needs):
                    orders[d].append(action)
                    done_at[action] = t
                    c[kind] += 1
                    break
        t += 1
    return Schedule(ScheduleKind.ZERO_BUBBLE_H2, p, m, 1, tuple(map(tuple, orders)), split_backward=True)


class KindInfo(NamedTuple):
    """A kind's builder, display name and matching ``torch.distributed.pipelining`` class (or None)."""

    build: Callable[..., Schedule]
    title: str
    torch_class: str | None


SCHEDULE_KINDS = {
    ScheduleKind.GPIPE: KindInfo(gpipe, "GPipe", "ScheduleGPipe"),
    ScheduleKind.ONE_F_ONE_B: KindInfo(one_f_one_b, "1F1B", "Schedule1F1B"),
    ScheduleKind.INTERLEAVED_1F1B: KindInfo(interleaved_1f1b, "Interleaved 1F1B", "ScheduleInterleaved1F1B"),
    ScheduleKind.ZERO_BUBBLE_H1: KindInfo(zero_bubble_h1, "ZB-H1", None),
    ScheduleKind.ZERO_BUBBLE_H2: KindInfo(zero_bubble_h2, "ZB-H2", None),
}
SCHEDULES = {kind: info.build for kind, info in SCHEDULE_KINDS.items()}  # kind -> builder


class _Title(NamedTuple):
    title: str


# kinds built from torch's own action lists (``from_torch``): a display name, no builder here
TORCH_ONLY_TITLES = {
    ScheduleKind.ZB_V: _Title("ZB-V (torch)"),
    ScheduleKind.INTERLEAVED_ZB: _Title("Interleaved ZB (torch)"),
    ScheduleKind.DUALPIPE_V: _Title("DualPipeV (torch)"),
}
