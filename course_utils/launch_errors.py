"""What went wrong in a launch: the errors ``launch`` raises, and how the culprit is found.

Each rank leaves marker files (``_rank_entry``): its pid when it starts, ``done``
when its function returned, ``error`` with its traceback when it raised. From
those, and the elastic agent's report, this module names the rank to blame and
stops every rank that is still running.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ._rank_entry import marker, read_error


class LaunchError(RuntimeError):
    """A multi-process launch did not complete."""


class RankFailedError(LaunchError):
    """A rank raised an exception (or died); ``rank`` says which."""

    def __init__(self, rank: int, exc_type: str, message: str, traceback: str):
        self.rank, self.exc_type, self.message, self.traceback = rank, exc_type, message, traceback
        super().__init__(f"rank {rank} failed with {exc_type}: {message}\n\n"
                         f"--- rank {rank} ---\n{traceback}".rstrip())


class LaunchTimeoutError(LaunchError, TimeoutError):
    """Some ranks had not returned after ``timeout`` seconds; ``unfinished`` lists them."""

    def __init__(self, unfinished: list[int], world_size: int, timeout: float):
        self.unfinished, self.timeout = unfinished, timeout
        finished = [r for r in range(world_size) if r not in unfinished]
        super().__init__(
            f"rank(s) {unfinished} did not finish within {timeout:g} s "
            f"(finished: {finished or 'none'}); they were stopped. A common cause is a rank "
            "that skips a collective the others wait in; if they were only slow, pass a larger timeout=.")


def stop_unfinished(run_dir: Path, world_size: int, before: set) -> None:
    """SIGKILL every rank that has not returned, and any worker that never reported."""
    for rank in range(world_size):
        pid_file = marker(run_dir, rank, "pid")
        if pid_file.exists() and not marker(run_dir, rank, "done").exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for child in set(mp.active_children()) - before:
        if not any(marker(run_dir, r, "pid").exists() and marker(run_dir, r, "pid").read_text() == str(child.pid)
                   for r in range(world_size)):
            child.kill()


_LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "remote process exited", "communicator was aborted")


def diagnose_failure(exc: ChildFailedError, run_dir: Path, world_size: int, engine_log: list[str]) -> LaunchError:
    """Turn the agent's ChildFailedError into a RankFailedError about the rank that failed first.

    A rank that dies without a Python exception (SIGKILL, a crash in native code)
    leaves no traceback, but its peers then fail with "connection closed by peer"
    errors that do: those are symptoms, so the silent rank is blamed, not them.
    """
    raised = {r: e for r in range(world_size) if (e := read_error(run_dir, r)) is not None}
    causes = {r: e for r, e in raised.items() if not any(p in e[1] for p in _LOST_PEER)}
    if causes:  # the rank whose error file is oldest raised first; the others followed it
        rank = min(causes, key=lambda r: marker(run_dir, r, "error").stat().st_mtime)
        return RankFailedError(rank, *causes[rank])
    reported_rank, failure = next(iter(sorted(exc.failures.items())))
    silent = [r for r in range(world_size) if r not in raised and not marker(run_dir, r, "done").exists()]
    if not silent:  # every failure was a lost connection: report the first
        rank = min(raised, key=lambda r: marker(run_dir, r, "error").stat().st_mtime)
        return RankFailedError(rank, *raised[rank])
    rank = reported_rank if reported_rank in silent else silent[0]
    code = failure.exitcode if rank == reported_rank else None
    how = ("was killed by a signal or crashed" if code is None
           else f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}")
    message = f"the process {how} without a Python exception"
    if raised:
        message += f"; rank(s) {sorted(raised)} then lost their connection to it"
    notes = [line for line in engine_log if not line.startswith("INFO")]
    return RankFailedError(rank, "ProcessExit", message,
                           "(no Python traceback; the launcher reported:)\n" + "\n".join(notes[-10:]))
