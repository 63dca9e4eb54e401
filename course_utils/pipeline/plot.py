"""Pictures of timelines: Gantt charts and live activations.

One colour per kind of action (F blue, B orange, W green; an interleaved
device's later stages in lighter shades), ``F(n,m)`` written in a bar where it
fits (else just m), idle time shaded grey with each device's idle share at the
right, and under the chart the number of micro-batch activations each device
holds over time. (The bubble-fraction sweep is ``simulate.plot_bubble_sweep``; a measured step
against the number of micro-batches, ``plot_step_sweep``.)

Taught in chapter 06.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from course_utils.runtime.cluster.plot import draw_lanes

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
LEGEND = {"F": "F forward", "B": "B backward", "W": "W weight grad"}
DPI = 80


def _colour(kind: str, chunk: int, chunks: int):
    """The kind's colour, mixed with white for later chunks of an interleaved device."""
    mix = 0.5 * chunk / max(chunks - 1, 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(COLORS[kind]))


def draw_gantt(
    timeline, ax, title: str | None = None, xmax: float | None = None, labels: bool = True
) -> None:
    """Draw ``timeline`` as a Gantt chart on ``ax`` (the course's one timeline plot,
    ``runtime.cluster.plot.draw_lanes``): one row per device, device 0 on top;
    ``labels``: write F(n,m) (or m) in the bars where it fits."""
    t0, span = timeline.start, timeline.makespan
    p, v = timeline.num_devices, timeline.meta.get("v", 1)
    xmax = xmax or span
    bars = []
    for e in timeline.events:
        a = e.action
        chunk = a.stage // p
        text = (str(a), str(a.microbatch)) if labels else ""
        bars.append(
            (
                e.device,
                e.start - t0,
                e.duration,
                _colour(a.kind, chunk, v),
                text,
                "white" if chunk == 0 else "black",
            )
        )
    draw_lanes(ax, [f"device {d}" for d in range(p)], bars, xmax, background=span)
    for d in range(p):
        ax.text(
            span + xmax * 0.01,
            d,
            f"idle\n{timeline.idle(d) / span:.0%}",
            va="center",
            fontsize=7,
            color="#555",
        )
    kinds = sorted({e.action.kind for e in timeline.events}, key="FBW".index)
    ax.legend(
        handles=[Patch(color=COLORS[k], label=LEGEND[k]) for k in kinds],
        fontsize=7,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    ax.set_title(
        title or f"{timeline.name}: bubble {timeline.bubble_fraction:.1%} of device time", fontsize=9
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def draw_activations(timeline, ax, xmax: float | None = None) -> None:
    """Step curves of live activations per device on ``ax``, in stage-equivalents (one
    micro-batch's activations of a whole device stage; an interleaved stage counts 1/v)."""
    t0, v = timeline.start, timeline.meta.get("v", 1)
    for d, peak in enumerate(timeline.peak_stage_equivalents()):
        steps = timeline.live_activations(d) + [(t0 + timeline.makespan, 0)]
        offset = 0.06 * (d - (timeline.num_devices - 1) / 2)  # keeps equal curves apart
        ax.step(
            [t - t0 for t, _ in steps],
            [c / v + offset for _, c in steps],
            where="post",
            lw=1.3,
            label=f"device {d} (peak {peak:g})",
        )
    ax.set_xlim(0, (xmax or timeline.makespan) * 1.09)
    if v == 1:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("activations held\n(stage-equivalents)", fontsize=8)
    ax.set_xlabel(f"time ({timeline.unit})", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_timeline(timeline, ax=None, activations: bool = True, title: str | None = None):
    """Gantt chart of ``timeline`` and, under it, its live-activation curves. Returns the figure."""
    if ax is not None:
        draw_gantt(timeline, ax, title)
        return ax.figure
    p = timeline.num_devices
    rows = [0.42 * p + 0.5] + ([1.3] if activations else [])
    fig, axes = plt.subplots(
        len(rows),
        1,
        figsize=(9, sum(rows) + 0.5),
        dpi=DPI,
        sharex=True,
        gridspec_kw={"height_ratios": rows},
        squeeze=False,
        layout="constrained",
    )
    draw_gantt(timeline, axes[0, 0], title)
    if activations:
        draw_activations(timeline, axes[1, 0])
    else:
        axes[0, 0].set_xlabel(f"time ({timeline.unit})", fontsize=8)
    return fig


def plot_timelines(timelines, activations: bool = False, labels: bool = True):
    """Several timelines stacked on one time scale, so their lengths compare. Returns the figure."""
    xmax = max(t.makespan for t in timelines)
    rows = []
    for t in timelines:
        rows += [0.38 * t.num_devices + 0.45] + ([1.0] if activations else [])
    fig, axes = plt.subplots(
        len(rows),
        1,
        figsize=(9, sum(rows) + 0.3 * len(timelines)),
        dpi=DPI,
        gridspec_kw={"height_ratios": rows},
        squeeze=False,
        layout="constrained",
    )
    axes = iter(axes[:, 0])
    for t in timelines:
        draw_gantt(t, next(axes), xmax=xmax, labels=labels)
        if activations:
            draw_activations(t, next(axes), xmax=xmax)
    return fig


def plot_step_sweep(ms, timelines, replays=None, title: str = ""):
    """The step (ms) against the number of micro-batches ``ms`` (one measured ``Timeline`` per m),
    beside each device's busy time and, if given, the ``replays`` with free messages. Returns
    the figure."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2), dpi=DPI, layout="constrained")
    ax.plot(ms, [t.makespan for t in timelines], "o-", label="step (measured)")
    if replays is not None:
        ax.plot(ms, [t.makespan for t in replays], "x--", label="step if messages were free (replay)")
    busy = [max(t.busy(d) for d in range(t.num_devices)) for t in timelines]
    ax.plot(ms, busy, "s:", label="busiest device's compute")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ms), [str(m) for m in ms])
    ax.set_xlabel("micro-batches m", fontsize=9)
    ax.set_ylabel(f"time ({timelines[0].unit})", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(title, fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
