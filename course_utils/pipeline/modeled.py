"""Reading a pipeline step measured on a modeled cluster: where its time goes.

On a modeled cluster (``run_schedules(..., cluster=...)``) every time is exact, so a measured
step can be taken apart, not just compared with a formula:

* ``message_ms``: what one activation (or its gradient) costs on the cluster's network between
  two stages, ``alpha + n / beta`` for ``n = rows x width x 4`` bytes;
* ``replay`` (``simulate``): the schedule again with each action's measured duration and a given
  message time: with 0 it is the step if messages were free, with ``message_ms`` the step if
  nothing but the schedule's dependencies and the messages made a device wait;
* ``where_time_goes``: those steps side by side with the formula's bubble and the measured one;
  what the replay with messages leaves unexplained is the compute slowed while a message ran on
  the same GPU (NCCL's kernels hold some of its SMs: ``Cluster.compute_speed_during_communication``);
* ``cluster_bubble``: the bubble read from the cluster's own timeline (idle compute-stream time
  over devices x step), the same measure for the executor and for torch's schedules;
* ``crossover_ms``: the message time at which one schedule's replay overtakes another's.

Taught in chapter 06's appendix 06a (sections 3, 4 and 6).
"""

from __future__ import annotations

from course_utils.pipeline.mlp import MLPConfig
from course_utils.pipeline.schedules import Schedule
from course_utils.pipeline.simulate import expected_bubble_fraction, replay

__all__ = ["message_ms", "where_time_goes", "cluster_bubble", "crossover_ms"]


def message_ms(cluster, config: MLPConfig, m: int, ranks: tuple = (0, 1)) -> float:
    """Milliseconds one message of a micro-batch's activation ``[batch / m, width]`` float32
    takes between ``ranks`` on ``cluster``'s network: ``alpha + n / beta``."""
    alpha, beta = cluster.network.link(list(ranks))
    return (alpha + (config.batch // m) * config.width * 4 / beta) * 1e3


def where_time_goes(schedule: Schedule, measured, comm_ms: float) -> dict:
    """Makespan (ms) and bubble of ``measured`` (a ``Timeline`` of ``schedule``), beside the
    formula's bubble and two replays of its actions: with free messages, and with each message
    taking ``comm_ms``. Returns ``{name: (makespan or None, bubble)}``."""
    free, paid = replay(schedule, measured, 0.0), replay(schedule, measured, comm_ms)
    return {
        "formula": (None, expected_bubble_fraction(schedule)),
        "replay, messages free": (free.makespan, free.bubble_fraction),
        "replay, messages paid": (paid.makespan, paid.bubble_fraction),
        "measured": (measured.makespan, measured.bubble_fraction),
    }


def cluster_bubble(timeline) -> float:
    """The bubble of a step from a modeled cluster's ``ClusterTimeline`` (one step's window):
    the time each rank's compute stream was idle, over ranks x the step's length."""
    ranks = timeline.ranks
    busy = sum(timeline.busy_ns(r) for r in ranks)
    return 1 - busy / (len(ranks) * timeline.makespan_ns)


def crossover_ms(first: tuple, second: tuple, high_ms: float = 100.0) -> float | None:
    """The message time (ms) at which ``second``'s replay becomes longer than ``first``'s;
    each is ``(schedule, measured Timeline)``. None if ``second`` is not faster with free
    messages, or still faster at ``high_ms``. Bisection to 1 ns."""

    def gap(comm: float) -> float:
        return replay(*second, comm).makespan - replay(*first, comm).makespan

    low, high = 0.0, high_ms
    if gap(low) >= 0 or gap(high) < 0:
        return None
    while high - low > 1e-6:
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) < 0 else (low, middle)
    return high
