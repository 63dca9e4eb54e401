"""Runs of schedules on real processes: start them, take turns, measure the steps as Timelines.

``run_schedule`` starts ``schedule.p`` processes (``launch``), each running its
``executor.ScheduleRunner``, and returns a ``PipelineRun``: the measured ``Timeline``
of each step (ms), the same type the simulator returns, plus the loss and gradients to
compare with one process. ``run_schedules`` runs several schedules on the same
processes, a step of each in turn, so that they are compared on the same machine state.

With ``cluster=`` the processes are ranks of a modeled GPU cluster: every time is its
virtual time, exact and the same on every machine, and each step also comes as the
cluster's own timeline (``PipelineRun.cluster_timeline``: compute spans named ``F(0,3)``,
and each message on its ``send to`` / ``recv from`` lane). ``meta=True`` builds the stages
and data on the ``meta`` device: real sizes priced, nothing computed (times only).

Taught in chapter 06's appendix 06a (section 2, the executor; section 3, measured timelines).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from course_utils.pipeline.executor import ScheduleRunner
from course_utils.pipeline.mlp import MLPConfig
from course_utils.pipeline.schedules import Schedule
from course_utils.pipeline.timeline import Event, Timeline
from course_utils.pipeline.validate import validate
from course_utils.runtime.cluster import ClusterTimeline
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.launcher import launch

__all__ = [
    "alternate",
    "pipeline_rank",
    "MeasuredRun",
    "PipelineRun",
    "check_runnable",
    "collect",
    "run_schedules",
    "run_schedule",
]


def alternate(runners: list, steps: int) -> list[dict]:
    """``steps`` steps of every runner, taking turns (one step of each, and again), so a
    busy moment of a shared machine slows all of them alike. Returns their results."""
    for _ in range(steps):
        for runner in runners:
            runner.step()
    return [runner.result() for runner in runners]


def pipeline_rank(schedules: list, config: MLPConfig, steps: int, meta: bool = False) -> list[dict]:
    """What each process runs (under ``launch``): ``steps`` steps of each schedule, in turns,
    on this rank's device (its GPU under NCCL, else the CPU), or on ``meta``."""
    device = torch.device("meta") if meta else rank_device()
    return alternate([ScheduleRunner(s, config, device) for s in schedules], steps)


@dataclass
class MeasuredRun:
    """Times of the measured steps (ms, slowest rank; modeled on a cluster, else wall time), the
    loss, every gradient by name and, on a modeled cluster, each step's ``ClusterTimeline``
    (every rank's spans, messages included)."""

    step_times_ms: list
    loss: float
    grads: dict = field(repr=False)
    cluster_timelines: list = field(default_factory=list, repr=False)

    @property
    def step_time_ms(self) -> float:
        """The median step time."""
        return statistics.median(self.step_times_ms)

    @property
    def cluster_timeline(self) -> ClusterTimeline:
        """The modeled cluster's timeline of the last step (every step is the same there)."""
        if not self.cluster_timelines:
            raise ValueError("no cluster timeline: run the schedule with cluster=Cluster(...)")
        return self.cluster_timelines[-1]


@dataclass
class PipelineRun(MeasuredRun):
    """A measured run of the executor, with each step's ``Timeline`` (ms) too."""

    timelines: list = field(default_factory=list, repr=False)

    @property
    def timeline(self) -> Timeline:
        """The timeline of the median step."""
        n = len(self.step_times_ms)
        return self.timelines[sorted(range(n), key=self.step_times_ms.__getitem__)[(n - 1) // 2]]

    @property
    def fastest(self) -> Timeline:
        """The timeline of the fastest step: on a shared machine, the one other programs
        disturbed least."""
        return self.timelines[self.step_times_ms.index(min(self.step_times_ms))]


def check_runnable(schedule: Schedule, config: MLPConfig, steps: int, warmup: int) -> None:
    """Clear errors in this process, before any other process starts."""
    validate(schedule)
    config.stages(schedule.num_stages)
    config.microbatches(schedule.m)
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")


def step_windows(results: list[dict], warmup: int) -> list[ClusterTimeline]:
    """On a modeled cluster, each measured step's stretch of every rank's timeline: from the
    step's start (the same on every rank after its barrier) to the last rank's end."""
    if not results[0].get("windows"):
        return []
    merged = ClusterTimeline.merge([r["timeline"] for r in results])
    return [
        merged.window(min(r["windows"][k][0] for r in results), max(r["windows"][k][1] for r in results))
        for k in range(warmup, len(results[0]["windows"]))
    ]


def collect(results: list[dict], warmup: int, schedule: Schedule | None = None) -> MeasuredRun:
    """Join the ranks' results of one run (``runner.result()``, warm-up steps dropped): each step's
    time (the slowest rank's), the loss (the sum of the micro-batches' shares) and the gradients by
    name. With our executor's ``schedule``, a PipelineRun with each step's Timeline (and on a modeled
    cluster its ClusterTimeline) too; else (torch's schedules) a MeasuredRun."""
    steps = range(warmup, len(results[0]["times"]))
    times = [max(r["times"][k] for r in results) for k in steps]
    loss = sum(loss for r in results for loss in r["losses"])
    grads = {name: g for r in results for name, g in r["grads"].items()}
    if schedule is None:
        return MeasuredRun(times, loss, grads, cluster_timelines=step_windows(results, warmup))
    timelines = [
        Timeline(
            tuple(
                Event(rank, a, start, end)
                for rank, r in enumerate(results)
                for a, start, end in r["events"][k]
            ),
            schedule.p,
            name=f"{schedule.name} (measured)",
            unit="ms",
            meta={"v": schedule.v},
        )
        for k in steps
    ]
    windows = step_windows(results, warmup)
    return PipelineRun(times, loss, grads, cluster_timelines=windows, timelines=timelines)


def run_schedules(
    schedules: list,
    config: MLPConfig = MLPConfig(),
    steps: int = 3,
    warmup: int = 1,
    timeout: float = 120.0,
    cluster=None,
    meta: bool = False,
) -> list[PipelineRun]:
    """Run several schedules for the same ``p`` on the same processes, a step of each in
    turn (a fair comparison on a shared machine): ``warmup`` untimed steps, then ``steps``
    measured ones each (the same batch, no optimizer step, so every step computes the same).
    ``cluster``: the processes run on that modeled cluster, and the times are its virtual time
    (``launch(..., cluster=...)``): exact, the same on every machine, so one step tells all.
    ``meta``: the stages and data live on the ``meta`` device, priced at full size by the
    cluster and never computed (needs ``cluster``; no loss or gradients then)."""
    if meta and cluster is None:
        raise ValueError("meta=True computes nothing, so only a modeled cluster can time it: pass cluster=")
    if len({s.p for s in schedules}) != 1:
        raise ValueError(f"schedules run together need the same p, got {[s.p for s in schedules]}")
    for s in schedules:
        check_runnable(s, config, steps, warmup)
    results = launch(
        pipeline_rank,
        schedules,
        config,
        warmup + steps,
        meta,
        world_size=schedules[0].p,
        timeout=timeout,
        show_output=False,
        cluster=cluster,
    )
    return [collect([r[i] for r in results], warmup, s) for i, s in enumerate(schedules)]


def run_schedule(
    schedule: Schedule,
    config: MLPConfig = MLPConfig(),
    steps: int = 3,
    warmup: int = 1,
    timeout: float = 120.0,
    cluster=None,
    meta: bool = False,
) -> PipelineRun:
    """Run ``schedule`` on ``schedule.p`` processes (see ``run_schedules``)."""
    return run_schedules([schedule], config, steps, warmup, timeout, cluster, meta)[0]
