"""Threads against processes (course_utils.data_parallel.gil): all three layouts timed alike.

The tests run on shared machines, with other jobs on the same cores, so they assert nothing that
needs idle cores. The GIL caps two Python threads at one core however idle or busy the machine: a
bound that load only moves further from. Two processes have no such cap, but how many cores they
keep busy depends on what the other jobs leave them; what holds under any load is that a scheduler
never leaves a core idle while a process is ready to run, so while both ranks compute, no core may
sit idle (on a quiet machine, they then keep two cores busy; on a busy one, the other jobs do).
"""

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from course_utils.data_parallel.gil import LAYOUTS, PythonWork, threads_vs_processes

PROC_STAT = Path("/proc/stat")


def idle_ticks(cpus) -> int:
    """Idle time of the CPUs ``cpus`` so far, in clock ticks (/proc/stat's idle and iowait columns)."""
    total = 0
    for line in PROC_STAT.read_text().splitlines():
        name, *ticks = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            total += int(ticks[3]) + int(ticks[4])
    return total


class SampledWork(PythonWork):
    """``PythonWork`` that also writes down, for each share, when it ran (the machine's monotonic
    clock, the same in every process) and the idle ticks of this process's CPUs before and after."""

    def __init__(self, n: int, out: str):
        super().__init__(n)
        self.out = out

    def __call__(self) -> int:
        cpus = os.sched_getaffinity(0)
        start, idle_before = time.monotonic(), idle_ticks(cpus)
        total = super().__call__()
        idle_after, end = idle_ticks(cpus), time.monotonic()
        if dist.get_world_size() == 2:
            layout = "processes"
        else:
            layout = "sequential" if threading.current_thread() is threading.main_thread() else "threads"
        record = {"layout": layout, "rank": dist.get_rank(), "start": start, "end": end}
        record.update(idle_before=idle_before, idle_after=idle_after, cpus=len(cpus))
        with open(os.path.join(self.out, f"{os.getpid()}-{threading.get_ident()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        return total


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """threads_vs_processes' figures, and the shares' records (``None`` without /proc/stat)."""
    if not PROC_STAT.exists():
        return threads_vs_processes(PythonWork(3_000_000), repeats=2), None
    out = tmp_path_factory.mktemp("shares")
    result = threads_vs_processes(SampledWork(3_000_000, str(out)), repeats=2)
    records = [json.loads(line) for path in sorted(out.iterdir()) for line in path.read_text().splitlines()]
    return result, records


def test_every_layout_is_timed_inside_launched_ranks_and_the_gil_stops_python_threads(measured):
    result, _ = measured
    assert set(LAYOUTS) <= set(result) and all(result[k] > 0 for k in LAYOUTS)
    assert result["threads_speedup"] == pytest.approx(result["sequential"] / result["threads"])
    assert result["processes_speedup"] == pytest.approx(result["sequential"] / result["processes"])
    # pure Python: one thread holds the GIL at a time, so two threads keep at most one core busy.
    # Cores busy (CPU seconds / wall seconds) is asserted rather than the speed-up because it
    # divides out the CPU's speed, and the bound holds on a busy machine too: other jobs can
    # only lower it. (The speed-up compares separate launches: the same sequential work took
    # 0.12 s to 0.22 s from one launch to the next on a shared 2-core VM.)
    assert result["threads_cores"] < 1.15, result
    assert result["sequential_cores"] < 1.15, result  # one thread
    assert result["processes_cores"] < 2.3, result  # two single-threaded processes
    # How many cores two processes keep busy depends on what other jobs leave them (0.65 was
    # seen with two other jobs on a 2-core VM): the next test asserts the
    # part that holds under any load.


@pytest.mark.skipif(not PROC_STAT.exists(), reason="reads the CPUs' idle time from /proc/stat (Linux)")
def test_processes_leave_no_core_idle_while_both_compute(measured):
    """Two ranks are two processes, each ready to run while it computes: the scheduler runs them
    on two cores whenever two are free, so while both compute, the CPUs they may use are idle at
    most where more than two are left (``cpus - 2``), whatever else the machine runs. Under a
    GIL-like lock (threads) one would wait with a core free, and that core would show idle on a
    quiet machine."""
    _, records = measured
    ranks = [
        sorted(
            (r for r in records if r["layout"] == "processes" and r["rank"] == k), key=lambda r: r["start"]
        )
        for k in (0, 1)
    ]
    assert [len(shares) for shares in ranks] == [2, 2], records  # one share per rank per round
    tick = 1 / os.sysconf("SC_CLK_TCK")
    window = idle = allowed = 0.0
    for a, b in zip(*ranks, strict=True):  # round by round: both ranks' shares of that round
        last = max((a, b), key=lambda r: r["start"])
        ends_first = min((a, b), key=lambda r: r["end"])
        if ends_first["end"] <= last["start"]:
            continue  # no overlap this round (the other rank never got a core meanwhile)
        span = ends_first["end"] - last["start"]
        window += span
        # idle between the later start and the earlier end; each CPU's counter counts whole
        # ticks, so the difference of two readings can be off by a tick on every CPU
        idle += (ends_first["idle_after"] - last["idle_before"]) * tick
        allowed += (max(a["cpus"] - 2, 0) + 0.25) * span + 2 * a["cpus"] * tick
    assert window > 0, records
    assert idle <= allowed, (idle, window, allowed, records)


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        threads_vs_processes(PythonWork(10), repeats=0)
