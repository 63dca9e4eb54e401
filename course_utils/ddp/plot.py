"""Chapter 04's figures of the modeled cluster: one step of each DDP variant, and the bucket-size U.

* ``plot_steps``: one panel per variant, a rank's compute and collectives lanes over one step
  (``ClusterTimeline.plot``, the course's one timeline plot), on one time axis;
* ``plot_bucket_sweep``: the time communication adds to a step against the bucket size.

Taught in chapter 04 (section 5b).
"""

from __future__ import annotations

__all__ = ["plot_steps", "plot_bucket_sweep"]


def plot_steps(timelines: dict, rank: int = 0, title: str = ""):
    """``timelines``: ``{variant: ClusterTimeline of one step}``; one panel per variant, ``rank``'s
    lanes, all on the longest step's time axis (ms). Returns the figure."""
    import matplotlib.pyplot as plt

    from course_utils.runtime.cluster import ClusterTimeline

    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(9, 0.85 * len(timelines) + 0.9), dpi=80, layout="constrained"
    )
    axes = axes if len(timelines) > 1 else [axes]
    longest = max(line.makespan_ns for line in timelines.values()) / 1e6
    for ax, (name, line) in zip(axes, timelines.items(), strict=True):
        mine = ClusterTimeline(tuple(s for s in line.spans if s.rank == rank), line.label)
        mine.plot(ax=ax)
        ax.set_title("")
        ax.set_title(name, fontsize=8, loc="left")
        ax.set_xlim(0, longest * 1.02)
        if ax is not axes[-1]:
            ax.set_xlabel("")
    fig.suptitle(title, fontsize=9)
    return fig


def plot_bucket_sweep(
    caps_mib: list[float], added_us: list[float], lines: dict | None = None, title: str = ""
):
    """The microseconds communication adds to a step (``added_us``) against the bucket size in MiB
    (``caps_mib``, log scale), with ``lines``: ``{label: microseconds}`` drawn across. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3), dpi=80, layout="constrained")
    ax.plot(caps_mib, added_us, "o-", label="bucketed by hand")
    for i, (label, value) in enumerate((lines or {}).items()):
        ax.axhline(value, color=f"C{i + 1}", ls="--", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bucket size (MiB)")
    ax.set_ylabel("added to the step (us)")
    ax.set_ylim(0, None)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return fig
