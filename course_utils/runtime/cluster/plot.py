"""The course's one timeline plot: bars on labelled rows, on one time axis.

``draw_lanes(ax, rows, bars)`` draws any timeline: each bar is ``(row, start, duration, colour,
text)``, the text written inside where it fits. The modeled cluster's timelines draw with it
(``plot_cluster_timeline``: a row per rank and lane), and so do the pipeline schedules of
chapter 06 (``course_utils.pipeline.plot``).

Taught in chapter 02 (a rank's timeline) and chapter 06 (pipeline schedules).
"""

from __future__ import annotations

__all__ = ["draw_lanes", "plot_cluster_timeline", "LANE_COLOURS"]

DPI = 80
LANE_COLOURS = {"compute": "#4C72B0", "callbacks": "#8172B2", "collectives": "#DD8452", "p2p": "#55A868"}


def _lane_colour(lane: str) -> str:
    if lane in LANE_COLOURS:
        return LANE_COLOURS[lane]
    if lane.startswith(("send", "recv")):
        return LANE_COLOURS["p2p"]
    return LANE_COLOURS["collectives"]


def draw_lanes(ax, rows: list[str], bars, xmax: float, background: float | None = None):
    """Draw ``bars`` on ``ax`` over ``[0, xmax]``, one row per label in ``rows`` (row 0 on top).

    A bar is ``(row, start, duration, colour, text)`` or ``(..., text, text_colour)``: ``text``
    is written inside it where it fits (a tuple of texts: the first that fits), in white unless
    ``text_colour`` says otherwise. ``background``: each row is shaded grey up to that time
    (idle unless a bar covers it). Returns ``ax``."""
    width = xmax * 1.09 if xmax > 0 else 1.0
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    fig = ax.figure
    points_per_unit = ax.get_position().width * fig.get_figwidth() * 72 / width
    if background:
        for row in range(len(rows)):
            ax.barh(row, background, left=0, height=0.8, color="#e4e4e4", linewidth=0)
    for row, start, duration, colour, text, *rest in bars:
        ax.barh(row, duration, left=start, height=0.8, color=colour, edgecolor="white", linewidth=0.6)
        for label in text if isinstance(text, tuple) else (text,):
            if label and duration * points_per_unit > 4.3 * len(label) + 2:
                colour_of_text = rest[0] if rest else "white"
                ax.text(
                    start + duration / 2,
                    row,
                    label,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color=colour_of_text,
                )
                break
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def plot_cluster_timeline(timeline, ax=None, title: str | None = None):
    """A ``ClusterTimeline`` as a Gantt chart in milliseconds, one row per rank and lane."""
    import matplotlib.pyplot as plt

    rows, index = [], {}
    for r in timeline.ranks:
        for lane in timeline.lanes(r):
            index[r, lane] = len(rows)
            rows.append(f"rank {r} {lane}")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.0), dpi=DPI, layout="constrained")
    t0 = timeline.start_ns
    bars = [
        (index[s.rank, s.lane], (s.start_ns - t0) / 1e6, s.duration_ns / 1e6, _lane_colour(s.lane), s.name)
        for s in timeline.spans
    ]
    draw_lanes(ax, rows, bars, timeline.makespan_ns / 1e6, background=timeline.makespan_ns / 1e6)
    ax.set_xlabel("modeled time (ms)", fontsize=8)
    ax.set_title(title or timeline.label, fontsize=9)
    return ax.figure
