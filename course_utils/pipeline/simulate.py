"""Simulate a schedule: given what each action costs, when does each one run?

Each device runs its actions in order. An action starts when its device is
free and its dependencies have finished (plus ``comm`` when a dependency ran
on another device, the time to move the activation or gradient). The result
is a ``Timeline``, the same type the real executor measures.

The bubble is the idle device-time of a step; its fraction is idle / (devices x makespan).
The textbook formulas the simulation reproduces (uniform stages, no comm):

    GPipe, 1F1B         bubble fraction (p-1)/(m+p-1)
    interleaved 1F1B    bubble fraction (p-1)/(vm+p-1)   (Megatron-LM writes (p-1)/(vm): idle
                                                          over busy time, the same bubble)
    ZB-H1               idle per device (p-1)(F+B-W) instead of 1F1B's (p-1)(F+B+W)
                        (when W <= F and W <= B)
    ZB-H2               one synchronous step: idle per device (p-1)F, its ramps (F/2, B/2 <= W <= F, B);
                        steps back to back, no synchronization (``steady_state``): (p-1)(F+B-2W)
                        (Qi et al., ICLR 2024, Table 1; checked here for W <= F and W <= B)

``plot_bubble_sweep`` draws the simulated bubble against the formula, for every schedule.

Taught in chapter 06; ``steady_state`` (ZB-H2's steps back to back) in appendix 06b, section 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from course_utils.pipeline.schedules import SCHEDULES, Action, Schedule, ScheduleKind
from course_utils.pipeline.timeline import Event, Timeline
from course_utils.pipeline.validate import dependencies, execution_order, validate


@dataclass(frozen=True)
class Costs:
    """Time of one action of one stage. ``B``: the input gradient, ``W``: the weight
    gradient; a schedule that does not split the backward runs both in one B, costing
    B + W. ``comm``: delay to move a tensor between devices."""

    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    comm: float = 0.0

    def __post_init__(self):
        for name in ("F", "B", "W", "comm"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"cost {name} must be a number >= 0, got {getattr(self, name)!r}")

    def of(self, kind: str, split_backward: bool) -> float:
        if kind == "B" and not split_backward:
            return self.B + self.W
        return getattr(self, kind)

    def per_chunk(self, v: int) -> Costs:
        """Costs of one of ``v`` equal pieces of a stage (interleaved), same comm."""
        return Costs(self.F / v, self.B / v, self.W / v, self.comm)


def simulate(schedule: Schedule, costs: Costs | Sequence[Costs] = Costs(), unit: str = "unit") -> Timeline:
    """Timeline of ``schedule`` when every action costs what ``costs`` says: one ``Costs``
    for all stages, or a list with one per stage (stages of unequal cost)."""
    s = validate(schedule)
    per_stage = [costs] * s.num_stages if isinstance(costs, Costs) else list(costs)
    if len(per_stage) != s.num_stages:
        raise ValueError(
            f"give one Costs for all stages or one per stage ({s.num_stages}), got {len(per_stage)}"
        )
    free_at, end, events = [0.0] * s.p, {}, []
    for d, action in execution_order(s)[0]:  # each action after its dependencies
        c = per_stage[action.stage]
        deps = dependencies(action, s.num_stages, s.split_backward)
        ready = max(
            [end[dep] + (c.comm if s.device_of(dep.stage) != d else 0.0) for dep in deps], default=0.0
        )
        start = max(free_at[d], ready)
        end[action] = free_at[d] = start + c.of(action.kind, s.split_backward)
        events.append(Event(d, action, start, end[action]))
    return Timeline(tuple(events), s.p, name=s.name, unit=unit, meta={"v": s.v})


def replay(schedule: Schedule, measured: Timeline, comm: float = 0.0) -> Timeline:
    """``schedule`` simulated with each action's own duration in ``measured`` (a run of the same
    schedule) and ``comm`` for every message between devices: what the measured step would be
    if the only waits were the schedule's dependencies and the messages' time."""
    s = validate(schedule)
    duration = {e.action: e.duration for e in measured.events}
    missing = [a for actions in s.devices for a in actions if a not in duration]
    if missing:
        raise ValueError(f"the measured timeline lacks {missing[0]}: replay a run of the same schedule")
    free_at, end, events = [0.0] * s.p, {}, []
    for d, action in execution_order(s)[0]:
        deps = dependencies(action, s.num_stages, s.split_backward)
        ready = max([end[dep] + (comm if s.device_of(dep.stage) != d else 0.0) for dep in deps], default=0.0)
        start = max(free_at[d], ready)
        end[action] = free_at[d] = start + duration[action]
        events.append(Event(d, action, start, end[action]))
    return Timeline(tuple(events), s.p, name=f"{s.name} (replayed)", unit=measured.unit, meta={"v": s.v})


def measured_costs(timeline: Timeline, num_stages: int) -> list[Costs]:
    """Per stage, the median measured duration of its F, B and W actions (comm 0): to
    simulate a schedule with the costs a real run had. Without W actions, B is the
    whole backward and W is 0."""
    costs = []
    for n in range(num_stages):
        median = {
            k: statistics.median(
                [e.duration for e in timeline.events if e.action.stage == n and e.action.kind == k] or [0.0]
            )
            for k in "FBW"
        }
        costs.append(Costs(median["F"], median["B"], median["W"]))
    return costs


def gpipe_bubble_fraction(p: int, m: int) -> float:
    """GPipe and 1F1B: (p-1)/(m+p-1) of all device-time is idle."""
    return (p - 1) / (m + p - 1)


def interleaved_bubble_ratio(p: int, m: int, v: int) -> float:
    """Interleaved 1F1B: idle time is (p-1)/(v m) of the busy time (Megatron-LM's way to write it)."""
    return (p - 1) / (v * m)


def interleaved_bubble_fraction(p: int, m: int, v: int) -> float:
    """Interleaved 1F1B: (p-1)/(vm+p-1) of all device-time is idle (the ratio r as r/(1+r))."""
    return (p - 1) / (v * m + p - 1)


def zb_h1_bubble_time(p: int, costs: Costs) -> float:
    """ZB-H1: each device idles (p-1)(F+B-W) (1F1B: (p-1)(F+B+W)), when W <= F and W <= B."""
    if costs.W > min(costs.F, costs.B):
        raise ValueError(f"the ZB-H1 formula assumes W <= F and W <= B, got {costs}")
    return (p - 1) * (costs.F + costs.B - costs.W)


def zb_h2_bubble_time(p: int, costs: Costs) -> float:
    """ZB-H2, steps back to back (``steady_state``): each device idles (p-1)(F+B-2W) per step
    (Qi et al., ICLR 2024, Table 1), here for W <= F and W <= B."""
    if costs.W > min(costs.F, costs.B):
        raise ValueError(f"the ZB-H2 formula is checked here for W <= F and W <= B, got {costs}")
    return (p - 1) * (costs.F + costs.B - 2 * costs.W)


def repeat_steps(schedule: Schedule, steps: int) -> Schedule:
    """``steps`` training steps with no synchronization between them, as optimizer
    post-validation allows: each device runs its step-k actions (micro-batches k m .. k m + m-1),
    then at once its step k+1 (a stage steps its own optimizer after its last W, checked later)."""
    m = schedule.m
    devices = tuple(
        tuple(Action(a.kind, a.stage, a.microbatch + k * m) for k in range(steps) for a in actions)
        for actions in schedule.devices
    )
    return Schedule(
        schedule.kind, schedule.p, m * steps, schedule.v, devices, schedule.split_backward, schedule.placement
    )


class SteadyState(NamedTuple):
    """Steps back to back: ``period`` between two steps' ends, per device the ``idle`` time per
    step, and ``bubble_fraction`` = idle / (devices x period)."""

    period: float
    idle: list
    bubble_fraction: float


def steady_state(schedule: Schedule, costs: Costs | Sequence[Costs] = Costs(), steps: int = 4) -> SteadyState:
    """The bubble of ``schedule`` when step after step runs with no synchronization between
    them (``repeat_steps``): the period is the growth of the makespan from steps-1 to steps."""
    longer, shorter = (simulate(repeat_steps(schedule, k), costs) for k in (steps, steps - 1))
    period = longer.makespan - shorter.makespan
    one = simulate(schedule, costs)
    idle = [period - one.busy(d) for d in range(schedule.p)]
    return SteadyState(period, idle, sum(idle) / (schedule.p * period))


def expected_bubble_fraction(schedule: Schedule, costs: Costs = Costs()) -> float:
    """The formula's bubble fraction (idle / devices x makespan) for ``schedule``, no comm."""
    p, m, v = schedule.p, schedule.m, schedule.v
    if schedule.kind in (ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B):
        return gpipe_bubble_fraction(p, m)
    if schedule.kind == ScheduleKind.INTERLEAVED_1F1B:
        return interleaved_bubble_fraction(p, m, v)
    if schedule.kind == ScheduleKind.ZERO_BUBBLE_H1:
        idle = zb_h1_bubble_time(p, costs)
        return idle / (idle + m * (costs.F + costs.B + costs.W))
    if schedule.kind == ScheduleKind.ZERO_BUBBLE_H2:  # one synchronous step: its ramps, (p-1)F
        if not max(costs.F, costs.B) / 2 <= costs.W <= min(costs.F, costs.B):
            raise ValueError(
                f"the one-step ZB-H2 formula is checked here for F/2, B/2 <= W <= F, B; got {costs}"
            )
        idle = (p - 1) * costs.F
        return idle / (idle + m * (costs.F + costs.B + costs.W))
    raise ValueError(f"no formula for a schedule of kind {schedule.kind!r}")


def plot_bubble_sweep(p: int, ms, v: int = 2, costs: Costs = Costs()):
    """Bubble fraction against the number of micro-batches m, for each schedule: simulated
    (markers) and the formula (line). ``ms`` must be multiples of p (interleaved needs it)."""
    import matplotlib.pyplot as plt

    from course_utils.pipeline.plot import DPI

    fig, ax = plt.subplots(figsize=(6.5, 3.4), dpi=DPI, layout="constrained")
    for (kind, make), marker in zip(SCHEDULES.items(), "osD^v", strict=True):
        interleaved = kind == ScheduleKind.INTERLEAVED_1F1B
        shown, simulated, formula = [], [], []
        for m in ms:
            if kind == ScheduleKind.ZERO_BUBBLE_H2 and m < 2 * p - 1:
                continue  # ZB-H2 needs m >= 2p-1
            shown.append(m)
            schedule = make(p, m, v) if interleaved else make(p, m)
            c = costs.per_chunk(schedule.v)
            simulated.append(simulate(schedule, c).bubble_fraction)
            formula.append(expected_bubble_fraction(schedule, c))
        (line,) = ax.plot(shown, formula, lw=1.2, alpha=0.8, ls="--" if kind == ScheduleKind.GPIPE else "-")
        ax.plot(
            shown,
            simulated,
            marker,
            color=line.get_color(),
            ms=5,
            mfc="none",
            label=kind.title + (f" (v={v})" if interleaved else ""),
        )
    ax.set_xlabel("micro-batches m", fontsize=9)
    ax.set_ylabel("bubble fraction", fontsize=9)
    ax.set_title(
        f"p = {p} devices, F={costs.F:g} B={costs.B:g} W={costs.W:g}: simulated (markers), formula (lines)",
        fontsize=9,
    )
    ax.tick_params(labelsize=8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, frameon=False)
    return fig
