"""What each rank's modeled GPU did, and when: spans on lanes, in whole nanoseconds.

A ``Span(rank, lane, name, start_ns, end_ns)`` is one stretch of work on one lane of a rank:

* ``compute``: the compute stream, named by what ran (``forward``, ``backward``, ``optimizer``,
  a ``region`` of your own, ``slowed by communication``);
* ``collectives``: a process group's collectives (``all_reduce 1.05 MB``), one lane per group;
* ``send to 1`` / ``recv from 0``: point-to-point messages, one lane per peer and direction;
* ``callbacks``: work a future's callback ran (DDP's fp16 hook decompressing a bucket).

``ClusterTimeline`` holds the spans of one or more ranks (``merge`` joins the ranks' own), and
draws them (``plot``, the course's one timeline plot, ``plot.draw_lanes``) or writes them as a
Chrome / Perfetto trace (``to_chrome_trace``: open it in https://ui.perfetto.dev).

Taught in chapter 02 (the modeled cluster's timelines).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Span", "ClusterTimeline"]


@dataclass(frozen=True)
class Span:
    """Rank ``rank`` worked on ``lane`` at ``name`` from ``start_ns`` to ``end_ns``."""

    rank: int
    lane: str
    name: str
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _lane_order(lane: str) -> tuple:
    first = {"compute": 0, "callbacks": 1}.get(lane)
    return (first, "") if first is not None else (2, lane)


@dataclass(frozen=True)
class ClusterTimeline:
    """Spans of one or more ranks; ``label`` names the cluster they ran on."""

    spans: tuple
    label: str = ""

    def __post_init__(self):
        ordered = sorted(
            self.spans, key=lambda s: (s.rank, _lane_order(s.lane), s.start_ns, s.end_ns, s.name)
        )
        object.__setattr__(self, "spans", tuple(ordered))

    @classmethod
    def merge(cls, timelines, label: str | None = None) -> ClusterTimeline:
        """One timeline of every rank's (``timelines``: what each rank's ``timeline()`` returned)."""
        timelines = list(timelines)
        spans = tuple(s for t in timelines for s in t.spans)
        return cls(spans, label if label is not None else (timelines[0].label if timelines else ""))

    # -- reading it --------------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.spans})

    def lanes(self, rank: int) -> list[str]:
        return sorted({s.lane for s in self.spans if s.rank == rank}, key=_lane_order)

    def on(self, rank: int, lane: str | None = None) -> list[Span]:
        """The spans of ``rank`` (on ``lane``, if given), in time order."""
        return [s for s in self.spans if s.rank == rank and (lane is None or s.lane == lane)]

    @property
    def start_ns(self) -> int:
        return min((s.start_ns for s in self.spans), default=0)

    @property
    def end_ns(self) -> int:
        return max((s.end_ns for s in self.spans), default=0)

    @property
    def makespan_ns(self) -> int:
        return self.end_ns - self.start_ns

    def busy_ns(self, rank: int, lane: str = "compute") -> int:
        """Nanoseconds ``rank``'s ``lane`` was busy (overlapping spans counted once)."""
        total, reach = 0, None
        for s in self.on(rank, lane):
            start = s.start_ns if reach is None else max(s.start_ns, reach)
            if s.end_ns > start:
                total += s.end_ns - start
            reach = s.end_ns if reach is None else max(reach, s.end_ns)
        return total

    def window(self, start_ns: int, end_ns: int) -> ClusterTimeline:
        """The spans inside ``[start_ns, end_ns)``, cut to it (one step of a longer run)."""
        cut = [
            Span(s.rank, s.lane, s.name, max(s.start_ns, start_ns), min(s.end_ns, end_ns))
            for s in self.spans
            if s.end_ns > start_ns and s.start_ns < end_ns
        ]
        return ClusterTimeline(tuple(cut), self.label)

    def summary(self) -> str:
        """One line per rank: its end (from the timeline's start), and its compute and communication
        busy time, in ms."""
        lines = [self.label] if self.label else []
        for r in self.ranks:
            comm = [lane for lane in self.lanes(r) if lane not in ("compute", "callbacks")]
            busy = sum(self.busy_ns(r, lane) for lane in comm)
            lines.append(
                f"rank {r}: ends at {(self.end_of(r) - self.start_ns) / 1e6:.3f} ms, compute "
                f"{self.busy_ns(r) / 1e6:.3f} ms, communication {busy / 1e6:.3f} ms"
            )
        return "\n".join(lines)

    def end_of(self, rank: int) -> int:
        return max((s.end_ns for s in self.on(rank)), default=0)

    # -- views ----------------------------------------------------------------------------------
    def plot(self, ax=None, title: str | None = None):
        """Gantt chart: one row per rank and lane. Returns the figure."""
        from course_utils.runtime.cluster.plot import plot_cluster_timeline

        return plot_cluster_timeline(self, ax=ax, title=title)

    def to_chrome_trace(self, path: str | Path | None = None) -> dict:
        """A Chrome / Perfetto trace (one process per rank, one track per lane), written to
        ``path`` as JSON when given; open it in https://ui.perfetto.dev."""
        t0 = self.start_ns
        events = []
        tids = {}
        for r in self.ranks:
            events.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
            for i, lane in enumerate(self.lanes(r)):
                tids[r, lane] = i
                events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": i, "args": {"name": lane}})
        for s in self.spans:
            events.append(
                {
                    "name": s.name,
                    "cat": s.lane,
                    "ph": "X",
                    "pid": s.rank,
                    "tid": tids[s.rank, s.lane],
                    "ts": (s.start_ns - t0) / 1e3,
                    "dur": s.duration_ns / 1e3,
                }
            )
        trace = {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"cluster": self.label}}
        if path is not None:
            Path(path).write_text(json.dumps(trace))
        return trace
