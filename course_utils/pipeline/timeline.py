"""Timelines: what each device did when, simulated or measured, and what it costs.

A ``Timeline`` is a list of ``Event(device, action, start, end)``. The simulator
(``simulate``) and the real executor (``run_schedule``) both return one, so the
same numbers and the same plot describe a prediction and a measurement.

    makespan          first start to last end
    bubble_fraction   the bubble (idle device-time) / (devices x makespan): the share
                      of the machine that waited (GPipe, 1F1B: (p-1)/(m+p-1))
    bubble_ratio      the same idle time / busy device-time: how much longer than a
                      pipeline without bubbles (Megatron-LM's (p-1)/(vm) for interleaving)
    live_activations  per device, how many micro-batches' activations are held
                      over time: +1 when F(n,m) starts, -1 when the last
                      backward of (n,m) ends (B, or W where B is split);
                      ``peak_stage_equivalents`` counts an interleaved stage as 1/v

Taught in chapter 06 (chapter 05 measures one step as a Timeline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.pipeline.schedules import Action


@dataclass(frozen=True)
class Event:
    """``device`` ran ``action`` from ``start`` to ``end`` (in the timeline's unit)."""

    device: int
    action: Action
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Timeline:
    """Timed events on ``num_devices`` devices; ``unit`` names the time unit ("unit", "ms")."""

    events: tuple
    num_devices: int
    name: str = ""
    unit: str = "unit"
    meta: dict = field(default_factory=dict, compare=False)  # {"v": model chunks per device}, for the plot

    def __post_init__(self):
        bad = [e for e in self.events if not (0 <= e.device < self.num_devices) or e.end < e.start]
        if bad:
            raise ValueError(f"events need 0 <= device < {self.num_devices} and end >= start; got {bad[0]}")
        object.__setattr__(self, "events", tuple(sorted(self.events, key=lambda e: (e.device, e.start))))

    # --- time ----------------------------------------------------------------------
    @property
    def start(self) -> float:
        return min(e.start for e in self.events)

    @property
    def makespan(self) -> float:
        """Time from the first start to the last end."""
        return max(e.end for e in self.events) - self.start

    def on(self, device: int) -> list[Event]:
        """The events of one device, in time order."""
        return [e for e in self.events if e.device == device]

    def busy(self, device: int) -> float:
        return sum(e.duration for e in self.on(device))

    def idle(self, device: int) -> float:
        """The time ``device`` spent waiting within the makespan."""
        return self.makespan - self.busy(device)

    @property
    def bubble_fraction(self) -> float:
        """Idle device-time over all device-time (devices x makespan)."""
        return sum(self.idle(d) for d in range(self.num_devices)) / (self.num_devices * self.makespan)

    @property
    def bubble_ratio(self) -> float:
        """Idle device-time over busy device-time: the slow-down against no bubble at all."""
        return sum(self.idle(d) for d in range(self.num_devices)) / sum(e.duration for e in self.events)

    # --- memory --------------------------------------------------------------------
    def live_activations(self, device: int) -> list[tuple[float, int]]:
        """Steps ``(time, count)``: micro-batch activations held on ``device`` from that time."""
        freed_by = {}  # (stage, micro-batch) -> end of its last backward
        for e in self.on(device):
            if e.action.kind in ("B", "W"):
                key = (e.action.stage, e.action.microbatch)
                freed_by[key] = max(freed_by.get(key, e.end), e.end)
        changes = [(e.start, +1) for e in self.on(device) if e.action.kind == "F"]
        changes += [(t, -1) for t in freed_by.values()]
        steps, count = [(self.start, 0)], 0
        for t, delta in sorted(changes, key=lambda c: (c[0], c[1])):  # frees before allocations at a tie
            count += delta
            if t == steps[-1][0]:  # several changes at one time: keep the result
                steps[-1] = (t, count)
            else:
                steps.append((t, count))
        return steps

    def peak_activations(self) -> list[int]:
        """Per device, the most micro-batch activations held at once (one per stage and
        micro-batch: an interleaved device's stages are 1/v of a device's layers each)."""
        return [max(c for _, c in self.live_activations(d)) for d in range(self.num_devices)]

    def peak_stage_equivalents(self) -> list[float]:
        """``peak_activations`` in whole-device stages: with v stages per device each counts 1/v."""
        v = self.meta.get("v", 1)
        return [c / v for c in self.peak_activations()]

    # --- views ---------------------------------------------------------------------
    def summary(self) -> str:
        unit = "units" if self.unit == "unit" else self.unit
        return (
            f"{self.name}: makespan {self.makespan:.4g} {unit}, bubble {self.bubble_fraction:.1%} "
            f"of device time, peak live activations per device {self.peak_activations()}"
        )

    def grid(self, slot: float = 1.0) -> str:
        """A text chart, one row per device, one column per ``slot`` of time:
        ``F3`` = a forward of micro-batch 3 (``FF`` from micro-batch 10 on), ``.`` = idle.
        Meant for unit costs."""
        width = int(round(self.makespan / slot))
        lines = []
        for d in range(self.num_devices):
            cells = [" ."] * width
            for e in self.on(d):
                a = e.action
                label = f"{a.kind}{a.microbatch}" if a.microbatch < 10 else a.kind * 2
                first, last = (int(round((t - self.start) / slot)) for t in (e.start, e.end))
                cells[first:last] = [label] * (last - first)
            lines.append(f"device {d} |" + " ".join(cells) + "|")
        return "\n".join(lines)

    def plot(self, ax=None, **kwargs):
        """Gantt chart with idle time shaded, and the live-activation curve under it."""
        from course_utils.pipeline.plot import plot_timeline

        return plot_timeline(self, ax=ax, **kwargs)

    def to_chrome_trace(self, path=None) -> dict:
        """Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing)."""
        from course_utils.pipeline.trace import chrome_trace

        return chrome_trace(self, path)
