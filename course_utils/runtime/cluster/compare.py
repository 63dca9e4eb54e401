"""The roofline against a real device: each ATen operator's modeled time beside its measured one.

``compare_step(step, cluster)`` runs ``step()`` twice more after a warm-up:

1. in this process under the modeled cluster: the roofline's price of every operator the dispatch
   mode sees (``charged(by_op=True)``);
2. under ``torch.profiler``: the time of those same operators, each with everything it ran inside
   (an operator's own kernels and its helpers' - ``relu`` runs ``clamp_min``), counted once (an
   operator the mode sees inside another one it sees, say ``copy_`` inside ``_to_copy``, is part
   of the outer one). On a GPU that is the kernels' device time; on a CPU, the CPU time.

and lines them up: ``{"op", "calls", "measured_us", "modeled_us", "ratio"}`` per operator, the
largest measured first. ``comparison_table`` writes them as markdown with the totals.
``gpu_report`` prints it for the course's DLRM step on the GPU it finds.

Taught in chapter 02 (how far to trust the roofline; the report runs it on your GPU).
"""

from __future__ import annotations

import torch

__all__ = ["compare_step", "comparison_table"]


def _inclusive_us(event, on_gpu: bool) -> float:
    if not on_gpu:
        return event.cpu_time_total
    for name in ("device_time_total", "cuda_time_total"):  # renamed in torch 2.4
        value = getattr(event, name, None)
        if value is not None:
            return value
    return 0.0


def _modeled(step, cluster) -> dict[str, dict]:
    from course_utils.runtime import cluster as modeled

    modeled.install(cluster)
    try:
        step()
        by_op = modeled.charged(by_op=True)["by_op"]
    finally:
        modeled.uninstall()
    return {op: {"calls": t["calls"], "us": t["ns"] / 1e3} for op, t in by_op.items()}


def _measured(step, ops: set, steps: int) -> dict[str, dict]:
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    times: dict[str, dict] = {}
    for event in prof.events():
        if event.name not in ops:
            continue
        parent = event.cpu_parent
        while parent is not None and parent.name not in ops:
            parent = parent.cpu_parent
        if parent is not None:  # inside an operator the mode sees: counted there
            continue
        tally = times.setdefault(event.name, {"calls": 0.0, "us": 0.0})
        tally["calls"] += 1 / steps
        tally["us"] += _inclusive_us(event, on_gpu) / steps
    return times


def compare_step(step, cluster, steps: int = 5, warmup: int = 2) -> list[dict]:
    """Per operator of one ``step()``: its calls, measured and modeled microseconds, and
    modeled / measured (None where nothing was measured); see the module docstring."""
    for _ in range(warmup):
        step()
    modeled = _modeled(step, cluster)
    measured = _measured(step, set(modeled), steps)
    rows = []
    for op in sorted(modeled, key=lambda o: -measured.get(o, {}).get("us", 0.0)):
        us = measured.get(op, {}).get("us", 0.0)
        model_us = modeled[op]["us"]
        rows.append(
            {
                "op": op,
                "calls": modeled[op]["calls"],
                "measured_us": us,
                "modeled_us": model_us,
                "ratio": model_us / us if us > 0 else None,
            }
        )
    return rows


def comparison_table(rows: list[dict], top: int = 12) -> list[str]:
    """A markdown table of the ``top`` rows by measured time, and a line of totals."""
    lines = [
        "| operator | calls | measured (us) | modeled (us) | modeled / measured |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows[:top]:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(
            f"| `{r['op']}` | {r['calls']:g} | {r['measured_us']:.1f} | {r['modeled_us']:.1f} | {ratio} |"
        )
    measured, modeled = sum(r["measured_us"] for r in rows), sum(r["modeled_us"] for r in rows)
    total = f"{modeled / measured:.2f}" if measured else "-"
    lines.append(f"| all {len(rows)} operators | | {measured:.1f} | {modeled:.1f} | {total} |")
    return lines
