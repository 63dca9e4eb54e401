"""The GIL: the same work done by two threads and by two processes.

Python runs one thread's bytecode at a time (the global interpreter lock); PyTorch
releases the lock inside each operator. ``threads_vs_processes`` isolates what that
means for data parallelism: the same forward/backward work, done by one thread after
the other, by two threads at once (DataParallel's ``parallel_apply``), and by two
processes at once (DDP's ranks, through ``launch``).

Taught in chapter 03 (section 5, the GIL: threads against processes).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from course_utils.runtime.launcher import launch
from course_utils.workload.models import DLRMConfig
from course_utils.workload.train import bce_loss

__all__ = [
    "forward_backward",
    "DLRMWork",
    "PythonWork",
    "one_torch_thread",
    "timed_rank",
    "threads_vs_processes",
]


def forward_backward(model: nn.Module, batch, steps: int) -> None:
    """``steps`` x (forward, BCE loss, backward) of ``model`` on one batch."""
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        bce_loss(model, batch).backward()


class DLRMWork:
    """One worker's share of work: ``steps`` forward/backward passes of its own DLRM on ``batch``.

    On the CPU, on purpose, also on GPU machines: ``threads_vs_processes`` measures what
    the GIL does to Python threads that share CPU cores, not the GPUs.
    """

    def __init__(self, model_config: DLRMConfig, batch, steps: int = 10):
        self.model_config, self.batch, self.steps = model_config, batch, steps

    def prepare(self) -> DLRMWork:
        """A copy with its own model, warmed up (one pass), ready to be timed."""
        work = copy.copy(self)
        work.model = self.model_config.build(seed=0)
        forward_backward(work.model, self.batch, 1)
        return work

    def __call__(self) -> None:
        forward_backward(self.model, self.batch, self.steps)


class PythonWork:
    """One worker's share of pure-Python work (a loop of ``n`` multiply-adds): it holds the GIL throughout."""

    def __init__(self, n: int = 2_000_000):
        self.n = n

    def prepare(self) -> PythonWork:
        return self

    def __call__(self) -> int:
        total = 0
        for i in range(self.n):
            total += i * i
        return total


@contextlib.contextmanager
def one_torch_thread():
    """Run the block with one torch (intra-op) thread, as every rank of ``launch`` has."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def timed_rank(work, layout: str, repeats: int) -> list[tuple[float, float]]:
    """Inside a rank of ``launch``: ``(wall seconds, CPU seconds)`` of ``repeats`` rounds of ``work``,
    laid out as ``layout``. CPU seconds count every thread of this process.

    ``"sequential"``: this process does two shares one after the other (world size 1);
    ``"threads"``: this process runs two shares in two Python threads (world size 1);
    ``"processes"``: this rank does one share while the other rank does the other (world size 2).
    Every layout is timed the same way: in a fresh rank process, one torch thread, between
    two barriers, so the figures differ only by how the work is laid out.
    """
    jobs = [work.prepare()] if layout == "processes" else [work.prepare(), work.prepare()]
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        if layout == "threads":
            workers = [threading.Thread(target=job) for job in jobs]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        else:
            for job in jobs:
                job()
        cpu = time.process_time() - cpu_start
        dist.barrier()  # until the slower rank is done
        seconds.append((time.perf_counter() - start, cpu))
    return seconds


LAYOUTS = {"sequential": 1, "threads": 1, "processes": 2}  # layout -> ranks it runs on


def threads_vs_processes(work, repeats: int = 3) -> dict:
    """Seconds for two workers' shares of ``work`` (a ``DLRMWork`` or ``PythonWork``):

    ``sequential``: one thread does both shares, one after the other;
    ``threads``: two Python threads at once (DataParallel's ``parallel_apply``);
    ``processes``: two ranks of ``launch`` at once (DDP).
    Each figure is the best of ``repeats`` rounds (the least disturbed by other
    work on the machine), timed the same way for all three (``timed_rank``: inside
    freshly started processes with one torch thread). Also returns the speed-ups over
    sequential, ``threads_speedup`` and ``processes_speedup`` (2.0 is perfect on 2 cores),
    and for each layout ``<layout>_cores``: CPU seconds of all its threads and processes
    divided by wall seconds in that round, how many cores it kept busy on average (at most
    1 for Python threads under the GIL, however idle the machine).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    best = {}
    for layout, ranks in LAYOUTS.items():
        rounds = launch(timed_rank, work, layout, repeats, world_size=ranks, timeout=120, show_output=False)
        # a round ends with its slower rank; keep the least disturbed round
        wall, cpu = min(
            (max(w for w, _ in per_rank), sum(c for _, c in per_rank))
            for per_rank in zip(*rounds, strict=True)
        )
        best[layout], best[f"{layout}_cores"] = wall, cpu / wall
    best["threads_speedup"] = best["sequential"] / best["threads"]
    best["processes_speedup"] = best["sequential"] / best["processes"]
    return best
