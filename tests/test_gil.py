"""Threads against processes (course_utils.data_parallel.gil): the work, and the three layouts timed alike.

The tests run on shared machines, with other jobs on the same cores, so they assert nothing that
needs idle cores. The GIL caps two Python threads at one core however idle or busy the machine: a
bound that load only moves further from. Two processes have no such cap, nor have two threads
while both are inside PyTorch operators (which release the lock), but how many cores they keep
busy depends on what the other jobs leave them; what holds under any load is that a scheduler
never leaves a core idle while a process or thread is ready to run, so while both compute, no core
may sit idle (on a quiet machine, they then keep two cores busy; on a busy one, the other jobs do).
"""

import json
import os
import statistics
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_utils.data_parallel.gil import (
    LAYOUTS,
    DLRMWork,
    MatmulWork,
    PythonWork,
    fixed_share,
    one_thread_each,
    one_torch_thread,
    threads_vs_processes,
)
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig

pytestmark = [pytest.mark.chapter(3), pytest.mark.launches]

PROC_STAT = Path("/proc/stat")
REPEATS = 2


def idle_ticks(cpus) -> int:
    """Idle time of the CPUs ``cpus`` so far, in clock ticks (/proc/stat's idle and iowait columns)."""
    total = 0
    for line in PROC_STAT.read_text().splitlines():
        name, *ticks = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            total += int(ticks[3]) + int(ticks[4])
    return total


class Sampled:
    """A work whose shares also write down, each time one runs: when (the machine's monotonic clock,
    the same in every process), in which rank, process and thread, and the idle ticks of this
    process's CPUs before and after (``None`` without /proc/stat)."""

    def __init__(self, work, out: str):
        self.work, self.out = work, out

    def prepare(self):
        return Sampled(self.work.prepare(), self.out)

    def __call__(self):
        cpus = os.sched_getaffinity(0)
        idle = idle_ticks if PROC_STAT.exists() else lambda cpus: None
        start, idle_before = time.monotonic(), idle(cpus)
        result = self.work()
        idle_after, end = idle(cpus), time.monotonic()
        record = {"rank": dist.get_rank(), "pid": os.getpid(), "start": start, "end": end}
        record.update(main=threading.current_thread() is threading.main_thread(), cpus=len(cpus))
        record.update(idle_before=idle_before, idle_after=idle_after)
        with open(os.path.join(self.out, f"{os.getpid()}-{threading.get_ident()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        return result


# the shares rank 0 runs in one round, in order: (layout, which of the layout's two shares)
RANK0_ROUND = [("sequential", 0), ("sequential", 1), ("threads", 0), ("threads", 1), ("processes", 0)]


def with_layouts(records: list[dict]) -> list[dict]:
    """The records, each with the layout its share ran in and which of the round's two shares it
    was (0 or 1). Rank 1 runs a share only for "processes"; rank 0 runs its shares in its main
    thread, except for "threads". Each round takes the layouts in turn, so rank 0's shares run in
    the order: main, main (sequential), two threads, main (processes), and again."""
    rank0 = sorted((r for r in records if r["rank"] == 0), key=lambda r: r["start"])
    assert [r["main"] for r in rank0] == [layout != "threads" for layout, _ in RANK0_ROUND] * REPEATS, rank0
    for r, (layout, share) in zip(rank0, RANK0_ROUND * REPEATS, strict=True):
        r.update(layout=layout, share=share)
    rank1 = [dict(r, layout="processes", share=1) for r in records if r["rank"] == 1]
    assert len(rank1) == REPEATS and all(r["main"] for r in rank1), rank1
    return rank0 + rank1


def measure(work, out: Path) -> tuple[dict, list[dict]]:
    with warnings.catch_warnings():  # that other jobs kept the cores busy: what these tests allow for
        warnings.simplefilter("ignore")
        result = threads_vs_processes(Sampled(work, str(out)), repeats=REPEATS, tries=1)
    records = [json.loads(line) for path in sorted(out.iterdir()) for line in path.read_text().splitlines()]
    return result, with_layouts(records)


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    """threads_vs_processes' figures for pure Python, and where and when each share ran."""
    return measure(PythonWork(2_000_000), tmp_path_factory.mktemp("python"))


@pytest.fixture(scope="module")
def matmul(tmp_path_factory):
    """The same for a few big operators: products of [512, 512] matrices."""
    return measure(MatmulWork(size=512, steps=40), tmp_path_factory.mktemp("matmul"))


def test_every_layout_is_timed_inside_the_same_launched_ranks_in_turn(python):
    result, records = python  # with_layouts checked the order: every round, the layouts in turn
    pids = {r["rank"]: r["pid"] for r in records}
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values(), pids  # two ranks of launch
    assert all(r["pid"] == pids[r["rank"]] for r in records), records  # the same two for every layout
    rounds = result["rounds"]
    assert set(rounds) == set(LAYOUTS) and all(len(timings) == REPEATS for timings in rounds.values())
    for layout, timings in rounds.items():
        shares = [r for r in records if r["layout"] == layout]
        for i, (wall, cpu, each) in enumerate(timings):  # a round's time covers its shares, first to last
            ran = sorted(shares, key=lambda r: r["start"])[2 * i : 2 * i + 2]
            assert wall >= max(r["end"] for r in ran) - min(r["start"] for r in ran) - 1e-3, (wall, ran)
            assert cpu > 0 and len(each) == 2 and all(0 < c <= wall + 1e-3 for c in each), (wall, each)
        assert result[layout] == pytest.approx(statistics.median(w for w, _, _ in timings))
    for layout in ("threads", "processes"):  # each round compared with the sequential run of the same round
        ratios = [
            seq / wall for (seq, _, _), (wall, _, _) in zip(rounds["sequential"], rounds[layout], strict=True)
        ]
        assert result[f"{layout}_speedup"] == pytest.approx(statistics.median(ratios))


def test_the_gil_keeps_python_threads_to_one_core(python):
    result, _ = python
    # pure Python: one thread holds the GIL at a time, so two threads keep at most one core busy.
    # Cores busy (CPU seconds / wall seconds) is asserted rather than the speed-up because the
    # bound holds on a busy machine too: other jobs can only lower it.
    assert result["threads_cores"] < 1.15, result
    assert sum(result["threads_each"]) < 1.15, result  # each thread's own CPU time, added
    assert result["threads_each"][0] >= result["threads_each"][1]  # the busier thread first
    assert result["sequential_cores"] < 1.15, result  # one thread
    assert result["processes_cores"] < 2.3, result  # two single-threaded processes


def no_idle_core_while_both_compute(records: list[dict], layout: str) -> None:
    """While the two shares of each round of ``layout`` both compute, the CPUs this process may use
    are idle at most where more than two are left (``cpus - 2``), whatever else the machine runs:
    both are ready to run, and the scheduler runs them on two cores whenever two are free. If one
    waited for a lock with a core free, that core would show idle on a quiet machine."""
    shares = [r for r in records if r["layout"] == layout]
    pairs = [sorted((r for r in shares if r["share"] == k), key=lambda r: r["start"]) for k in (0, 1)]
    assert [len(p) for p in pairs] == [REPEATS, REPEATS], shares  # one share each per round
    tick = 1 / os.sysconf("SC_CLK_TCK")
    window = idle = allowed = 0.0
    for a, b in zip(*pairs, strict=True):  # round by round: both shares of that round
        last = max((a, b), key=lambda r: r["start"])
        ends_first = min((a, b), key=lambda r: r["end"])
        if ends_first["end"] <= last["start"]:
            continue  # no overlap this round (the other one never got a core meanwhile)
        span = ends_first["end"] - last["start"]
        window += span
        # idle between the later start and the earlier end; each CPU's counter counts whole
        # ticks, so the difference of two readings can be off by a tick on every CPU
        idle += (ends_first["idle_after"] - last["idle_before"]) * tick
        allowed += (max(a["cpus"] - 2, 0) + 0.25) * span + 2 * a["cpus"] * tick
    assert window > 0, shares
    assert idle <= allowed, (idle, window, allowed, shares)


@pytest.mark.skipif(not PROC_STAT.exists(), reason="reads the CPUs' idle time from /proc/stat (Linux)")
def test_two_processes_leave_no_core_idle_while_both_run_python(python):
    """Two ranks are two processes, each with its own interpreter and lock."""
    _, records = python
    no_idle_core_while_both_compute(records, "processes")


@pytest.mark.skipif(not PROC_STAT.exists(), reason="reads the CPUs' idle time from /proc/stat (Linux)")
def test_two_threads_leave_no_core_idle_while_both_multiply_big_matrices(matmul):
    """PyTorch releases the GIL inside each product, so neither thread waits for the lock."""
    _, records = matmul
    no_idle_core_while_both_compute(records, "threads")


def test_matmul_work_multiplies_its_own_matrices():
    work = MatmulWork(size=64, steps=3)
    one, two = work.prepare(), work.prepare()
    assert one.a.shape == one.b.shape == (64, 64) and one.a is not two.a  # each share its own
    assert torch.equal(one.a, two.a) and torch.equal(one.b, two.b)  # the same work
    torch.testing.assert_close(one(), one.a @ one.b)


def test_dlrm_work_runs_forwards_of_its_own_model():
    logs = data.make_click_logs(256, seed=0)
    config, batch = DLRMConfig(logs.cardinalities), logs[:16].to_torch()
    work = DLRMWork(config, batch, steps=2)
    one, two = work.prepare(), work.prepare()
    assert one.model is not two.model  # each share its own replica
    logits = one()
    assert logits.shape == (16,)
    torch.testing.assert_close(logits, config.build(seed=0)(batch.dense, batch.sparse))
    assert PythonWork(1000)() == sum(i * i for i in range(1000))


def test_fixed_share_falls_as_the_rows_grow():
    """On one row a forward costs its Python and its operators' fixed costs; on many rows the
    arithmetic adds to that. CPU time, so it holds on a busy machine too."""
    logs = data.make_click_logs(2048, seed=0)
    config = DLRMConfig(logs.cardinalities)
    few = fixed_share(DLRMWork(config, logs[:8].to_torch(), steps=20), repeats=3)
    many = fixed_share(DLRMWork(config, logs[:2048].to_torch(), steps=3), repeats=3)
    assert 0 < many < 0.3 < 0.6 < few, (few, many)  # no upper bound: noise can make one row dearer
    one_row = DLRMWork(config, logs[:8].to_torch(), steps=2).on_one_row()
    assert [tuple(t.shape) for t in one_row.batch] == [(1, 13), (1, 26), (1,)]


def test_a_new_thread_runs_a_product_on_one_core():
    """one_thread_each: the product's CPU time is the calling thread's, no helper threads' too."""
    spent = {}

    def product():
        a = torch.randn(512, 512)
        cpu, own = time.process_time(), time.thread_time()
        for _ in range(10):
            a @ a
        spent["process"], spent["thread"] = time.process_time() - cpu, time.thread_time() - own

    with one_torch_thread():
        worker = threading.Thread(target=one_thread_each, args=(product,))
        worker.start()
        worker.join()
    assert spent["process"] < 1.3 * spent["thread"], spent


def test_repeats_and_tries_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        threads_vs_processes(PythonWork(10), repeats=0)
    with pytest.raises(ValueError, match="tries must be at least 1"):
        threads_vs_processes(PythonWork(10), tries=0)
