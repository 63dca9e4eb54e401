"""The GIL: the same work done by two threads and by two processes.

Python runs one thread's bytecode at a time (the global interpreter lock); PyTorch
releases the lock inside each operator. ``threads_vs_processes`` isolates what that
means for data parallelism: the same work, done by one thread after the other, by two
threads at once (DataParallel's ``parallel_apply``), and by two processes at once (DDP's
ranks, through ``launch``), for three kinds of work: pure Python (``PythonWork``), a few
big operators (``MatmulWork``) and many small ones (``DLRMWork`` at a small batch).

Taught in chapter 03 (section 5, the GIL: threads against processes).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import threading
import time

import torch
import torch.distributed as dist

from course_utils.runtime.launcher import launch
from course_utils.workload.models import DLRMConfig

__all__ = [
    "PythonWork",
    "MatmulWork",
    "DLRMWork",
    "one_torch_thread",
    "one_thread_each",
    "LAYOUTS",
    "timed_rank",
    "FREE_CORES",
    "threads_vs_processes",
    "fixed_share",
]


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


class MatmulWork:
    """One worker's share of a few big operators: ``steps`` products ``a @ b`` of two
    ``[size, size]`` float32 matrices. Each product is one call that spends milliseconds
    inside PyTorch, with the GIL released."""

    def __init__(self, size: int = 1024, steps: int = 4):
        self.size, self.steps = size, steps

    def prepare(self) -> MatmulWork:
        """A copy with its own matrices ``a``, ``b`` ``[size, size]``, warmed up (one product)."""
        work = copy.copy(self)
        generator = torch.Generator().manual_seed(0)
        work.a, work.b = (torch.randn(self.size, self.size, generator=generator) for _ in range(2))
        work.a @ work.b
        return work

    def __call__(self) -> torch.Tensor:
        for _ in range(self.steps):
            product = self.a @ self.b  # [size, size]
        return product


class DLRMWork:
    """One worker's share of many small operators: ``steps`` forward passes of its own DLRM on
    ``batch`` (``dense [B, 13]``, ``sparse [B, 26]``), what each of ``parallel_apply``'s threads runs.

    On the CPU, on purpose, also on GPU machines: ``threads_vs_processes`` measures what
    the GIL does to Python threads that share CPU cores, not the GPUs.
    """

    def __init__(self, model_config: DLRMConfig, batch, steps: int = 10):
        self.model_config, self.batch, self.steps = model_config, batch, steps

    def prepare(self) -> DLRMWork:
        """A copy with its own model, warmed up (one forward), ready to be timed."""
        work = copy.copy(self)
        work.model = self.model_config.build(seed=0)
        work.model(self.batch.dense, self.batch.sparse)
        return work

    def __call__(self) -> torch.Tensor:
        for _ in range(self.steps):
            logits = self.model(self.batch.dense, self.batch.sparse)  # [B]
        return logits

    def on_one_row(self) -> DLRMWork:
        """The same forwards on the batch's first row: what they cost whatever the batch."""
        return DLRMWork(self.model_config, type(self.batch)(*(t[:1] for t in self.batch)), self.steps)


def fixed_share(work: DLRMWork, repeats: int = 5) -> float:
    """The share of one worker's CPU time that its forwards would cost on a single row: the Python
    around each operator and the operators' fixed costs, against the arithmetic on the rows.
    CPU seconds of this thread (``time.thread_time``), the least of ``repeats`` runs of each, taken
    in turn: other programs change the wall time far more than the CPU time a thread spends."""
    jobs = {"one row": work.on_one_row().prepare(), "batch": work.prepare()}
    spent: dict[str, list[float]] = {name: [] for name in jobs}
    with one_torch_thread():
        for _ in range(repeats):
            for name, job in jobs.items():
                start = time.thread_time()
                job()
                spent[name].append(time.thread_time() - start)
    return min(spent["one row"]) / min(spent["batch"])


@contextlib.contextmanager
def one_torch_thread():
    """Run the block with one torch (intra-op) thread, as every rank of ``launch`` has."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_thread_each(job, spent: list | None = None) -> None:
    """Run ``job`` in this new thread with one torch thread, as its rank has: a new thread does not
    inherit ``torch.set_num_threads`` for MKL's matrix products, which would use all the cores.
    ``spent``: a list the thread appends its own CPU seconds for the job to."""
    torch.set_num_threads(1)
    start = time.thread_time()
    job()
    if spent is not None:
        spent.append(time.thread_time() - start)


LAYOUTS = ("sequential", "threads", "processes")  # the order timed_rank takes them in, every round


def timed_rank(work, repeats: int) -> dict[str, list[tuple[float, float, list[float]]]]:
    """Inside each of the two ranks of ``launch``: ``{layout: [(wall seconds, CPU seconds, [CPU
    seconds of each share]), ...]}``, one per round, ``repeats`` rounds. CPU seconds count every
    thread of this process; a share's CPU seconds, the thread that ran it (``time.thread_time``).

    ``"sequential"``: rank 0 does two shares one after the other (rank 1 waits);
    ``"threads"``: rank 0 runs two shares in two Python threads (rank 1 waits);
    ``"processes"``: each rank does one share.
    Every round takes the three layouts in turn, so other programs' load falls on all three
    alike, and every layout is timed the same way: in the same two processes, one torch thread
    each, between two barriers. The figures differ only by how the work is laid out.
    """
    shares = [work.prepare(), work.prepare()] if dist.get_rank() == 0 else [work.prepare()]
    both = shares if len(shares) == 2 else []  # rank 1 waits while rank 0 does both shares
    jobs = {"sequential": both, "threads": both, "processes": shares[:1]}
    seconds = {layout: [] for layout in LAYOUTS}
    for _ in range(repeats):
        for layout in LAYOUTS:
            dist.barrier()
            spent: list[float] = []
            start, cpu_start = time.perf_counter(), time.process_time()
            if layout == "threads":
                workers = [
                    threading.Thread(target=one_thread_each, args=(job, spent)) for job in jobs[layout]
                ]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
            else:
                for job in jobs[layout]:
                    share_start = time.thread_time()
                    job()
                    spent.append(time.thread_time() - share_start)
            cpu = time.process_time() - cpu_start
            dist.barrier()  # until the slower rank is done
            seconds[layout].append((time.perf_counter() - start, cpu, spent))
    return seconds


#: Two processes that keep fewer cores busy than this did not have two free cores: other
#: programs were using the machine (``threads_vs_processes`` then measures again).
FREE_CORES = 1.5


def summarize(per_rank: list[dict]) -> dict:
    """``timed_rank``'s rounds from both ranks -> the figures of ``threads_vs_processes``."""
    rounds = {
        # a round of a layout lasts until its slower rank is done, and costs both ranks' CPU time
        layout: [
            (max(r[0] for r in ranks), sum(r[1] for r in ranks), [c for r in ranks for c in r[2]])
            for ranks in zip(*(seconds[layout] for seconds in per_rank), strict=True)
        ]
        for layout in LAYOUTS
    }
    figures = {"rounds": rounds}
    for layout, timings in rounds.items():
        figures[layout] = statistics.median(w for w, _, _ in timings)
        figures[f"{layout}_cores"] = statistics.median(c / w for w, c, _ in timings)
        figures[f"{layout}_share_cpu"] = statistics.median(c for _, _, shares in timings for c in shares)
    # each thread's CPU seconds per wall second, the busier thread first: at most 1, and load only lowers it
    each = [sorted((c / w for c in shares), reverse=True) for w, _, shares in rounds["threads"]]
    figures["threads_each"] = [statistics.median(t[i] for t in each) for i in range(2)]
    for layout in ("threads", "processes"):
        # the layouts of a round ran one after the other, under the same load: compare them there
        pairs = zip(rounds["sequential"], rounds[layout], strict=True)
        figures[f"{layout}_speedup"] = statistics.median(seq[0] / r[0] for seq, r in pairs)
    return figures


def threads_vs_processes(work, repeats: int = 5, tries: int = 1) -> dict:
    """Seconds for two workers' shares of ``work`` (a ``PythonWork``, ``MatmulWork`` or ``DLRMWork``):

    ``sequential``: one thread does both shares, one after the other;
    ``threads``: two Python threads at once (DataParallel's ``parallel_apply``);
    ``processes``: two ranks of ``launch`` at once (DDP).
    All three are timed alike, round after round in the same two ranks (``timed_rank``). Each
    figure is the median over ``repeats`` rounds: for each layout, its seconds,
    ``<layout>_cores``, the CPU seconds of both ranks divided by the wall seconds, how many cores
    it kept busy on average (at most 1 for threads that run Python, however idle the machine), and
    ``<layout>_share_cpu``, the CPU seconds of the thread that ran one share; ``threads_each``, each
    of the two threads' CPU seconds per wall second, the busier first (other programs only lower
    these); ``threads_speedup`` and ``processes_speedup``, the sequential layout's seconds divided by
    theirs in the same round (2.0 is perfect on 2 cores). ``rounds`` holds every round's
    ``(wall seconds, CPU seconds, [each share's CPU seconds])`` by layout.
    Two cores show what two cores do only while other programs leave them free: with ``tries``
    above 1, when the processes kept fewer than ``FREE_CORES`` busy it measures again, at most
    ``tries`` times in all, and returns the measurement whose processes kept the most cores busy
    (``"free"``: whether that one had them).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    measured = []
    for _ in range(tries):
        per_rank = launch(timed_rank, work, repeats, world_size=2, timeout=120, show_output=False)
        measured.append(summarize(per_rank))
        measured[-1]["free"] = measured[-1]["processes_cores"] >= FREE_CORES
        if measured[-1]["free"]:
            break
    return max(measured, key=lambda m: m["processes_cores"])
