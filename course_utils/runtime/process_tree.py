"""Stop a launcher and everything it started: SIGTERM, a grace period, then SIGKILL.

Killing ``torchrun``'s process group is not enough: torch starts every worker in a session of
its own (``start_new_session=True`` in ``SubprocessHandler``), so a worker is in no group of its
launcher's, and a launcher killed with SIGKILL cannot pass the signal on. Its workers then live
on as orphans until their own collective timeout (10 minutes on NCCL, 30 on gloo), holding GPU
memory, ports and files.

So the processes to stop are found by what they are, not by their group:

* **by descent**: every process whose parent chain leads to the launcher (``descendants``), read
  from ``/proc`` (Linux) or ``ps`` (macOS) while the launcher still lives;
* **by mark**: a launcher started with ``COURSE_RUN_MARK=<random>`` in its environment passes it
  to everything it starts (torchrun copies its environment into each worker's), and an orphan
  keeps it after its parent is gone (``marked``; Linux, where ``/proc/<pid>/environ`` is readable).

``stop_tree`` asks first (SIGTERM: torchrun passes it to its workers, a training script writes its
last checkpoint), waits ``grace`` seconds, then SIGKILLs whatever of the tree is still there.

Used by ``runner`` (torchrun, ``mp.spawn``), ``elastic_run``, ``slurm_local`` and ``launch``.
Taught in chapter 02 (section 5, what a launcher leaves behind) and chapter 08.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable

__all__ = [
    "MARK_VARIABLE",
    "new_mark",
    "parents",
    "descendants",
    "marked",
    "alive",
    "signal_all",
    "stop_processes",
    "stop_tree",
]

#: The environment variable that marks every process of one run (``new_mark`` gives its value).
MARK_VARIABLE = "COURSE_RUN_MARK"


def new_mark() -> dict[str, str]:
    """``{MARK_VARIABLE: <random>}``: add it to a launcher's environment to find its processes later."""
    return {MARK_VARIABLE: uuid.uuid4().hex}


def parents() -> dict[int, int]:
    """``{pid: parent pid}`` of every process this user can see."""
    found = {}
    if os.path.isdir("/proc/self"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                # the command name (2nd field) may hold spaces and ")": split after its last ")"
                stat = open(f"/proc/{name}/stat").read()
                found[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
        return found
    listing = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True)
    for line in listing.stdout.splitlines():
        with contextlib.suppress(ValueError):
            pid, ppid = map(int, line.split())
            found[pid] = ppid
    return found


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children, ...), not ``root`` itself."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child != root:
                found.append(child)
                todo.append(child)
    return found


def marked(mark: dict[str, str]) -> list[int]:
    """Processes whose environment holds ``mark`` (``new_mark()``'s dict), this one excepted.
    Empty where ``/proc`` is missing (macOS): there ``descendants`` is what finds them."""
    ((name, value),) = mark.items()
    wanted = f"{name}={value}".encode()
    found = []
    if not os.path.isdir("/proc/self"):
        return found
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                found.append(int(pid))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds that number
        return False
    with contextlib.suppress(OSError, IndexError):
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_processes(roots: Iterable[int], grace: float = 2.0, also: Iterable[int] = ()) -> None:
    """SIGTERM ``roots``, every process below them and ``also``; up to ``grace`` seconds for them
    to end; then SIGKILL what is left. The tree is read before the first signal (a process whose
    parent dies is adopted elsewhere, and is no longer found below it)."""
    roots = list(roots)
    tree = set(roots) | set(also)
    for pid in roots:
        tree.update(descendants(pid))
    signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.02)
    signal_all([p for p in tree if alive(p)], signal.SIGKILL)


def stop_tree(
    procs: Iterable[subprocess.Popen],
    mark: dict[str, str] | None = None,
    grace: float = 5.0,
) -> list[int]:
    """Stop each launcher in ``procs`` and every process it started; reap the launchers.

    SIGTERM to each launcher still running (torchrun passes it on to its workers), up to
    ``grace`` seconds for them to end, then SIGKILL to every process still there that descends
    from a launcher or carries ``mark`` (an orphan whose launcher was SIGKILLed is found by its
    mark only: on Linux). A second Ctrl-C during the grace period skips straight to SIGKILL. Returns the pids
    that had to be killed.
    """
    procs = list(procs)
    tree: set[int] = set()
    for proc in procs:
        tree.update(descendants(proc.pid))
    if mark:
        tree.update(marked(mark))
    running = [p for p in procs if p.poll() is None]
    interrupted = None
    try:
        signal_all((p.pid for p in running), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in running):
            time.sleep(0.05)
    except KeyboardInterrupt as exc:  # a second Ctrl-C: do not wait any longer
        interrupted = exc
    for proc in procs:  # what the launchers started since, and orphans that kept the mark
        tree.update(descendants(proc.pid))
    if mark:
        tree.update(marked(mark))
    tree.update(p.pid for p in procs if p.poll() is None)
    killed = sorted(pid for pid in tree if alive(pid))
    signal_all(killed, signal.SIGKILL)
    for proc in procs:
        proc.wait()
    deadline = time.monotonic() + 5.0  # the kernel ends SIGKILLed processes asynchronously
    while time.monotonic() < deadline and any(alive(p) for p in killed):
        time.sleep(0.02)
    if interrupted is not None:
        raise interrupted
    return killed
