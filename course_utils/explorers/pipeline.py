"""Pipeline explorer: how the bubble and the activation memory move with p, m, v and the costs.

``pipeline_view`` simulates one schedule (chapter 06's simulator) and puts the textbook formulas
beside what the simulation gives; ``draw_pipeline`` draws its timeline with both. Chapter 06 puts
sliders in front of ``draw_pipeline`` with ``explorers.explore``.

Formulas (uniform stages; the bubble formulas ignore the per-message cost ``comm``):

    bubble (idle device-time of a      GPipe, 1F1B: (p-1)/(m+p-1)
    step) as a fraction of devices x   interleaved: (p-1)/(vm+p-1)
    makespan                           ZB-H1: (p-1)(F+B-W) / ((p-1)(F+B-W) + m (F+B+W))
                                       ZB-H2 (W between F/2, B/2 and F, B): (p-1)F / ((p-1)F + m (F+B+W))
    peak activations on device d,      GPipe: m          1F1B: min(p-d, m)     ZB-H1: p
    in stage-equivalents               ZB-H2: 2p-1       interleaved: ((v-1) p + 2 (p-1-d) + 1) / v

(an interleaved device holds ``v`` chunks of ``1/v`` stage each, so its count of chunk
activations is divided by ``v``; device 0's ``(v-1) p + 2 p - 1`` chunks are Megatron-LM's extra
memory for interleaving).

Taught in chapter 06 (the explorer).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.pipeline.schedules import SCHEDULE_KINDS, ScheduleKind
from course_utils.pipeline.simulate import Costs, expected_bubble_fraction, simulate
from course_utils.pipeline.timeline import Timeline

__all__ = ["SCHEDULE_TITLES", "PipelineView", "peak_formula", "pipeline_view", "draw_pipeline", "CONTROLS"]

SCHEDULE_TITLES = {info.title: kind for kind, info in SCHEDULE_KINDS.items()}  # "1F1B" -> kind

CONTROLS = {
    "schedule": list(SCHEDULE_TITLES),
    "p": (2, 8, 1, 4),
    "m": (2, 32, 1, 8),
    "v": (1, 4, 1, 2),
    "F": (0.25, 4.0, 0.25, 1.0),
    "B": (0.25, 4.0, 0.25, 1.0),
    "W": (0.0, 4.0, 0.25, 1.0),
    "comm": (0.0, 2.0, 0.05, 0.0),
}


@dataclass(frozen=True)
class PipelineView:
    """One simulated schedule and the formulas beside it.

    ``bubble``: idle / (devices x makespan), simulated; ``bubble_formula``: the same from the
    formula (``None`` where it does not apply); ``peak``/``peak_formula``: per device, the most
    activations held at once, in stage-equivalents.
    """

    timeline: Timeline
    bubble: float
    bubble_formula: float | None
    peak: list[float]
    peak_formula: list[float]


def peak_formula(kind: ScheduleKind, p: int, m: int, v: int = 1) -> list[float]:
    """Per device, the formula's peak activations in stage-equivalents (see the module docstring)."""
    kind = ScheduleKind(kind)
    if kind == ScheduleKind.GPIPE:
        return [float(m)] * p
    if kind == ScheduleKind.ONE_F_ONE_B or (kind == ScheduleKind.INTERLEAVED_1F1B and v == 1):
        return [float(min(p - d, m)) for d in range(p)]
    if kind == ScheduleKind.INTERLEAVED_1F1B:
        return [min((v - 1) * p + 2 * (p - 1 - d) + 1, v * m) / v for d in range(p)]
    if kind == ScheduleKind.ZERO_BUBBLE_H1:
        return [float(min(p, m))] * p
    if kind == ScheduleKind.ZERO_BUBBLE_H2:
        return [float(2 * p - 1)] * p
    raise ValueError(f"no peak formula for {kind!r}")


def pipeline_view(
    schedule: str = "1F1B",
    p: int = 4,
    m: int = 8,
    v: int = 2,
    F: float = 1.0,
    B: float = 1.0,
    W: float = 1.0,
    comm: float = 0.0,
) -> PipelineView:
    """Simulate ``schedule`` (a title such as ``"1F1B"`` or a ``ScheduleKind``) with these costs.

    ``F, B, W``: one stage's forward, input-gradient and weight-gradient times (schedules that do
    not split the backward run ``B + W`` at once); ``comm``: the time one message takes; ``v``:
    stages per device, used by the interleaved schedule only. Raises ``ValueError`` for a schedule
    that cannot be built (e.g. interleaved with ``m`` not a multiple of ``p``), naming the fix.
    """
    kind = SCHEDULE_TITLES.get(schedule) or ScheduleKind(schedule)
    interleaved = kind == ScheduleKind.INTERLEAVED_1F1B
    build = SCHEDULE_KINDS[kind].build
    s = build(p, m, v) if interleaved else build(p, m)
    costs = Costs(F, B, W, comm)
    timeline = simulate(s, costs.per_chunk(v) if interleaved else costs)
    peak = [count / (v if interleaved else 1) for count in timeline.peak_activations()]
    try:
        formula = expected_bubble_fraction(s, Costs(F, B, W))
    except ValueError:  # ZB-H1's formula needs W <= F and W <= B, ZB-H2's also W >= F/2, B/2
        formula = None
    return PipelineView(timeline, timeline.bubble_fraction, formula, peak, peak_formula(kind, p, m, v))


def draw_pipeline(**knobs):
    """The timeline of ``pipeline_view(**knobs)`` with the simulated and formula bubble and peak
    memory in its title. A combination that cannot be built draws the reason instead."""
    import matplotlib.pyplot as plt

    from course_utils.pipeline.plot import plot_timeline

    try:
        view = pipeline_view(**knobs)
    except ValueError as error:
        fig, ax = plt.subplots(figsize=(9, 1.2))
        ax.axis("off")
        ax.text(0, 0.5, f"{error}", wrap=True, fontsize=9, va="center")
        return fig
    formula = "n/a for these costs" if view.bubble_formula is None else f"{view.bubble_formula:.1%}"
    comm = " (the formula ignores comm)" if knobs.get("comm") else ""
    title = (
        f"{view.timeline.name}: bubble {view.bubble:.1%} simulated, {formula} formula{comm}; "
        f"peak activations (stage-equivalents) {_fmt(view.peak)}, formula {_fmt(view.peak_formula)}"
    )
    return plot_timeline(view.timeline, activations=True, title=title)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{x:g}" for x in values) + "]"
