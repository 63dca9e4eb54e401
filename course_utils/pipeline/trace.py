"""Export a Timeline as a Chrome trace: open it in https://ui.perfetto.dev or chrome://tracing.

The trace event format is a JSON object whose ``traceEvents`` are, here, one
"complete" event (``"ph": "X"``) per action: ``name`` F(n,m), ``ts`` start and
``dur`` duration in microseconds, ``tid`` the device (one track per device),
plus metadata events naming the process and the tracks.

Taught in chapter 06's appendix 06a (section 5, export to Perfetto).
"""

from __future__ import annotations

import json
from pathlib import Path

_MICROSECONDS = {"ms": 1e3, "s": 1e6, "us": 1.0, "unit": 1e3}  # a simulated unit is shown as 1 ms


def chrome_trace(timeline, path: str | Path | None = None) -> dict:
    """The trace as a dict; also written to ``path`` (JSON) when given."""
    scale = _MICROSECONDS.get(timeline.unit)
    if scale is None:
        raise ValueError(f"unknown time unit {timeline.unit!r}; expected one of {sorted(_MICROSECONDS)}")
    name = timeline.name or "pipeline"
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}}]
    events += [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": d, "args": {"name": f"device {d}"}}
        for d in range(timeline.num_devices)
    ]
    for e in timeline.events:
        events.append(
            {
                "name": str(e.action),
                "cat": e.action.kind,
                "ph": "X",
                "pid": 0,
                "tid": e.device,
                "ts": round((e.start - timeline.start) * scale, 3),
                "dur": round(e.duration * scale, 3),
                "args": {"stage": e.action.stage, "microbatch": e.action.microbatch},
            }
        )
    trace = {"traceEvents": events, "displayTimeUnit": "ms"}
    if path is not None:
        Path(path).write_text(json.dumps(trace))
    return trace
