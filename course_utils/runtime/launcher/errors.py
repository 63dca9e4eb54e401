"""What went wrong in a launch: the errors ``launch`` raises, and how the culprit is found.

Each rank leaves marker files (``rank_entry``): its pid when it starts, ``done``
when its function returned, ``error`` with its traceback when it raised. From
those, and the elastic agent's report, this module names the rank to blame and
stops every rank that is still running.

Taught in chapter 00 (its errors, in "When a rank fails").
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import re
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from course_utils.runtime import process_tree
from course_utils.runtime.launcher.output import rank_log
from course_utils.runtime.launcher.rank_entry import finished, marker, read_error


class LaunchError(RuntimeError):
    """A multi-process launch did not complete."""


class RankFailedError(LaunchError):
    """A rank raised an exception (or died); ``rank`` says which."""

    def __init__(self, rank: int, exc_type: str, message: str, traceback: str):
        self.rank, self.exc_type, self.message, self.traceback = rank, exc_type, message, traceback
        super().__init__(
            f"rank {rank} failed with {exc_type}: {message}\n\n--- rank {rank} ---\n{traceback}".rstrip()
        )


class LaunchTimeoutError(LaunchError, TimeoutError):
    """Some ranks had not returned after ``timeout`` seconds; ``unfinished`` lists them.
    ``stuck``: ranks whose function had returned but whose process had not ended by then."""

    def __init__(self, unfinished: list[int], world_size: int, timeout: float, stuck: list[int] = ()):
        self.unfinished, self.timeout, self.stuck = unfinished, timeout, list(stuck)
        finished = [r for r in range(world_size) if r not in unfinished]
        if unfinished:
            message = (
                f"rank(s) {unfinished} did not finish within {timeout:g} s "
                f"(finished: {finished or 'none'}); they were stopped. A common cause is a rank "
                "that skips a collective the others wait in; if they were only slow, pass a larger timeout=."
            )
        else:
            message = (
                f"every rank's function returned, but rank(s) {self.stuck} had not ended within "
                f"{timeout:g} s (stuck tearing down the process group); they were stopped"
            )
        super().__init__(message)


def stop_unfinished(
    run_dir: Path, world_size: int, before: set, finished_too: bool = False, grace: float = 2.0
) -> list[int]:
    """Stop every rank that has not returned (with ``finished_too``, every rank still running),
    any worker that never reported, and every process they started: SIGTERM, up to ``grace``
    seconds, then SIGKILL (``process_tree``). Only this process's descendants, and processes
    carrying the launch's mark (``COURSE_RUN_MARK`` in this process's environment, which whatever
    the ranks start inherits), are signalled: a pid read from a marker file may be another
    process's by now. Returns the finished ranks that were still running."""
    mine = set(process_tree.descendants(os.getpid()))
    pids = {}
    for rank in range(world_size):
        with contextlib.suppress(FileNotFoundError, ValueError):
            pids[rank] = int(marker(run_dir, rank, "pid").read_text())
    ranks = [r for r, pid in pids.items() if pid in mine and (finished_too or not finished(run_dir, r))]
    stuck = [r for r in ranks if finished(run_dir, r)]
    roots = [pids[r] for r in ranks]
    roots += [c.pid for c in set(mp.active_children()) - before if c.pid not in pids.values()]
    mark = os.environ.get(process_tree.MARK_VARIABLE)
    orphans = []
    if finished_too and mark:  # what the ranks started, and left behind when they ended
        parents = process_tree.parents()
        # not this process's own helpers that started meanwhile (multiprocessing's resource tracker)
        orphans = [
            pid
            for pid in process_tree.marked({process_tree.MARK_VARIABLE: mark})
            if parents.get(pid) != os.getpid()
        ]
    process_tree.stop_processes(roots, grace, also=orphans)
    return stuck


_LOST_PEER = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
    "communicator was aborted",
)


def diagnose_failure(
    exc: ChildFailedError, run_dir: Path, world_size: int, engine_log: list[str]
) -> LaunchError:
    """Turn the agent's ChildFailedError into a RankFailedError about the rank that failed first.

    A rank that dies without a Python exception (SIGKILL, a crash in native code)
    leaves no traceback, but its peers then fail with "connection closed by peer"
    errors that do: those are symptoms, so the silent rank is blamed, not them.
    """
    raised = {r: e for r in range(world_size) if (e := read_error(run_dir, r)) is not None}
    causes = {r: e for r, e in raised.items() if not any(p in e[1] for p in _LOST_PEER)}

    def first(ranks):  # the rank whose error file is oldest raised first; the others followed it
        return min(ranks, key=lambda r: marker(run_dir, r, "error").stat().st_mtime)

    if causes:
        rank = first(causes)
        return RankFailedError(rank, *causes[rank])
    reported_rank, failure = next(iter(sorted(exc.failures.items())))
    notes = [line for line in engine_log if not line.startswith("INFO")]
    silent = [r for r in range(world_size) if r not in raised and not finished(run_dir, r)]
    if not silent and raised:  # every failure was a lost connection: report the first
        rank = first(raised)
        return RankFailedError(rank, *raised[rank])
    if reported_rank not in raised and finished(run_dir, reported_rank):
        # its function returned and left its result; the process then died: nothing of a peer's
        # made it die (a finished rank only waits for the others, then leaves its group)
        return RankFailedError(
            reported_rank,
            "ProcessExit",
            f"rank {reported_rank}'s function returned, but its process then {_how(failure.exitcode)} "
            "(while waiting for the other ranks to return, or leaving its process group)",
            "(the launcher reported:)\n" + "\n".join(notes[-10:]),
        )
    rank = reported_rank if reported_rank in silent else silent[0]
    code = failure.exitcode if rank == reported_rank else None
    said = stderr_tail(run_dir, rank)
    if code is None:  # the engine reported a peer first; faulthandler's line still names the signal
        code = signal_from_stderr(said)
    message = f"the process {_how(code)} without a Python exception"
    if raised:
        message += f"; rank(s) {sorted(raised)} then lost their connection to it"
    return RankFailedError(
        rank,
        "ProcessExit",
        message,
        (f"(no Python traceback; its stderr as it died:)\n{said}\n" if said else "(no Python traceback)\n")
        + "(the launcher reported:)\n"
        + "\n".join(notes[-10:]),
    )


def _how(code: int | None) -> str:
    """How a process ended, from its exit code (minus the signal number when a signal ended it)."""
    if code is None:
        return "was killed by a signal or crashed"
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


# C++'s std::terminate, glibc's heap checks ("malloc(): unaligned tcache chunk detected",
# "double free or corruption"), Python's faulthandler
_NATIVE_DEATH = re.compile(
    r"terminate called|malloc\(\)|free\(\)|double free|corrupted|Fatal Python error|Segmentation fault"
)


def stderr_tail(run_dir: Path, rank: int, lines: int = 40) -> str:
    """What rank ``rank`` wrote to stderr as it died in native code, at most ``lines`` lines from
    the first line that says so (``_NATIVE_DEATH``): the C++ or glibc message, then Python's
    "Fatal Python error: Aborted" and each thread's Python stack (the elastic agent turns
    ``faulthandler`` on in every rank). If no such line is there, its last 10 lines; empty if
    it wrote nothing."""
    text = rank_log(Path(run_dir) / "logs", rank, "stderr").rstrip().splitlines()
    text = [ln for ln in text if not ln.startswith("Extension modules:")]
    start = next((i for i, ln in enumerate(text) if _NATIVE_DEATH.search(ln)), None)
    return "\n".join(text[-10:] if start is None else text[start : start + lines]).rstrip()


# what faulthandler (on in every rank, see stderr_tail) prints for each fatal signal it handles
_FAULTHANDLER_SIGNALS = {
    "Aborted": signal.SIGABRT,
    "Segmentation fault": signal.SIGSEGV,
    "Floating point exception": signal.SIGFPE,
    "Bus error": signal.SIGBUS,
    "Illegal instruction": signal.SIGILL,
}


def signal_from_stderr(said: str) -> int | None:
    """The exit code (minus the signal number) that faulthandler's "Fatal Python error: <name>"
    line in a rank's stderr stands for, or None. The engine stops at the first failure it
    polls: when that is a peer's lost connection, the silent rank's own exit code is not in its
    report, but what it printed as it died is."""
    found = re.search(r"Fatal Python error: ([A-Za-z ]+)", said)
    sig = _FAULTHANDLER_SIGNALS.get(found.group(1).strip()) if found else None
    return -int(sig) if sig is not None else None
