"""Nothing left behind, nobody let in: after a runner's timeout, a failed partner or Ctrl-C, and after
``launch``'s timeout or Ctrl-C, no process of the run remains, read from the process table; while a
2-rank ``launch`` runs, every socket its processes listen on is bound to loopback.

torchrun starts each worker in a session of its own, so these tests' workers are exactly what
killing a launcher's process group used to miss; each also starts a child of its own, in its own
session, and one of them ignores SIGTERM, so that the SIGKILL after the grace period is needed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from course_utils import launch
from course_utils.runtime import process_tree, runner
from course_utils.runtime.launcher import LaunchTimeoutError

pytestmark = [pytest.mark.chapter(0, 2, 8), pytest.mark.launches]

WORKER = """
import os, signal, subprocess, sys, time
from pathlib import Path
out, rank = Path(sys.argv[1]), os.environ.get("RANK", "0")
if rank == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends this one
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
(out / f"child{rank}.pid").write_text(str(child.pid))
(out / f"worker{rank}.pid").write_text(str(os.getpid()))
if sys.argv[2:3] == ["fail"]:  # once the other launcher's workers and children run
    while len(list(Path(sys.argv[3]).glob("*.pid"))) < 4:
        time.sleep(0.05)
    sys.exit("this launcher fails on purpose")
time.sleep(600)
"""


def _torchrun(tmp_path: Path, *extra: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [*runner.LAUNCHERS["torchrun"], "--standalone", "--nproc-per-node", "2", str(script), *extra]


def _started(folder: Path, count: int) -> list[int]:
    """The pids the workers (and their children) wrote, once ``count`` files are there."""
    files = sorted(folder.glob("*.pid"))
    return [int(f.read_text()) for f in files] if len(files) >= count else []


def _wait_until(condition, seconds: float) -> None:
    """Return once ``condition()`` is true, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _assert_nothing_left(pids: list[int], tag: dict[str, str]) -> None:
    assert pids, "the workers never wrote their pids"
    left = [p for p in pids if process_tree.alive(p)]
    tagged = [p for p in process_tree.marked(tag) if process_tree.alive(p)]
    if left or tagged:  # say what they are, from the process table
        listed = ",".join(map(str, left + tagged))
        table = subprocess.run(
            ["ps", "-o", "pid,ppid,sid,stat,args", "-p", listed], capture_output=True, text=True
        )
        table = table.stdout
        raise AssertionError(f"left running: {sorted(set(left + tagged))}\n{table}")


def test_a_runner_timeout_stops_torchruns_workers_and_what_they_started(tmp_path):
    tag = {"COURSE_TEST_TAG": uuid.uuid4().hex}
    (tmp_path / "a").mkdir()

    def up(procs):  # the runner's first look waits for the workers and their children (on a busy
        # machine starting them can take longer than the timeout), so that the timeout finds them running
        _wait_until(lambda: len(_started(tmp_path / "a", 4)) == 4, seconds=120)

    with pytest.raises(runner.LauncherError, match=r"still running after 8 s"):
        runner.run_together(
            [_torchrun(tmp_path, str(tmp_path / "a"))], timeout=8, extra_env=[tag], grace=2, watch=up
        )
    _assert_nothing_left(_started(tmp_path / "a", 4), tag)


def test_a_failed_partner_stops_the_other_launchers_workers(tmp_path):
    tag = {"COURSE_TEST_TAG": uuid.uuid4().hex}
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    hangs = _torchrun(tmp_path, str(tmp_path / "a"))
    fails = _torchrun(tmp_path, str(tmp_path / "b"), "fail", str(tmp_path / "a"))
    with pytest.raises(runner.LauncherError, match=r"launcher 1 of 2 exited with code 1"):
        runner.run_together([hangs, fails], timeout=120, extra_env=[tag, tag], grace=2)
    _assert_nothing_left(_started(tmp_path / "a", 4) + _started(tmp_path / "b", 4), tag)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_ctrl_c_during_a_runner_stops_everything_it_started(tmp_path):
    """SIGINT to this process, as Jupyter's interrupt sends it to the kernel, once the workers run."""
    tag = {"COURSE_TEST_TAG": uuid.uuid4().hex}
    (tmp_path / "a").mkdir()
    sent = []

    def interrupt_when_running(procs):
        if not sent and len(_started(tmp_path / "a", 4)) == 4:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, as a kernel has it: a process started in the background by a
    # shell without job control inherits SIGINT ignored, and Python then leaves it ignored
    handler_before = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run_together(
                [_torchrun(tmp_path, str(tmp_path / "a"))],
                timeout=120,
                extra_env=[tag],
                grace=2,
                watch=interrupt_when_running,
            )
    finally:
        signal.signal(signal.SIGINT, handler_before)
    assert sent and time.monotonic() - start < 60
    _assert_nothing_left(_started(tmp_path / "a", 4), tag)


# --- launch ---------------------------------------------------------------------------------


def start_a_child_then_hang(folder):
    """Each rank starts a child in a session of its own (as torchrun starts its workers), then
    rank 0 hangs in a collective that rank 1 never joins, and rank 1 returns."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(folder, f"child{rank}.pid").write_text(str(child.pid))
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    return rank


def test_a_launch_timeout_stops_the_ranks_and_what_they_started(tmp_path):
    with pytest.raises(LaunchTimeoutError, match=r"rank\(s\) \[0\] did not finish within 6 s"):
        launch(start_a_child_then_hang, str(tmp_path), world_size=2, timeout=6, show_output=False)
    pids = _started(tmp_path, 4)
    assert len(pids) == 4 and [p for p in pids if process_tree.alive(p)] == []


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_ctrl_c_during_a_launch_stops_the_ranks_and_what_they_started(tmp_path):
    def interrupt_when_running():
        deadline = time.monotonic() + 60
        while len(_started(tmp_path, 4)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        launch(start_a_child_then_hang, str(tmp_path), world_size=2, timeout=120, show_output=False)
    pids = _started(tmp_path, 4)
    assert len(pids) == 4 and [p for p in pids if process_tree.alive(p)] == []


def returns_but_never_ends():
    """The function returns, but the process cannot end: a thread that never stops keeps it alive,
    as a rank that hangs in NCCL's teardown after its function returned."""
    import torch.distributed as dist

    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
    return dist.get_rank()


def test_a_rank_that_returned_but_never_ends_is_stopped_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError, match=r"every rank's function returned, but rank\(s\) \[0, 1\]"):
        launch(returns_but_never_ends, world_size=2, timeout=5, show_output=False)
    assert time.monotonic() - start < 60


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP socket the processes ``pids`` listen on, read from
    ``/proc/<pid>/fd`` (which sockets each holds) and ``/proc/net/tcp{,6}`` (state 0A: LISTEN)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir() if fds.exists() else ():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                raw, port = fields[1].split(":")
                # the kernel prints each 32-bit word of the address in host (little-endian) order
                packed = b"".join(bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, len(raw), 8))
                found.append((inodes[fields[9]], socket.inet_ntop(family, packed), int(port, 16)))
    return found


def all_reduce_then_wait(seconds):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    time.sleep(seconds)  # the test reads the sockets meanwhile
    return dist.get_rank()


def own_group_then_wait(seconds):
    """The rank starts the default group itself (``init_group=False``, ``env://``)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    time.sleep(seconds)
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
@pytest.mark.parametrize("function, init_group", [(all_reduce_then_wait, True), (own_group_then_wait, False)])
def test_every_socket_a_2_rank_launch_listens_on_is_loopback(function, init_group):
    seen: set = set()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.update(listening_sockets([os.getpid(), *process_tree.descendants(os.getpid())]))
            time.sleep(0.05)

    reader = threading.Thread(target=watch)
    reader.start()
    try:
        launch(function, 2.0, world_size=2, timeout=60, show_output=False, init_group=init_group)
    finally:
        stop.set()
        reader.join()
    ranks = {pid for pid, _, _ in seen if pid != os.getpid()}
    # rank 0's store and each rank's gloo listener, at least, were seen
    assert len(ranks) == 2 and len(seen) >= 3, seen
    assert {address for _, address, _ in seen} == {"127.0.0.1"}, sorted(seen)
