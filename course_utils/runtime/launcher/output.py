"""The notebook side of a launch: quiet engine logs, per-rank output, stdio, signals.

``launch`` borrows the process's logging, standard streams, signal handlers and
environment while the elastic agent runs; these helpers take them and give them
back, and print what each rank wrote, grouped by rank.

Taught in chapter 00 (each rank's prints shown grouped by rank, after the run).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path

_ENGINE_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
# Lines the engines write into every rank's output, whatever the rank does; dropped from what
# show_rank_output prints, so that a notebook's output is the same on every torch version:
# * c10 log lines, "[W1122 15:30:01.1 pid file.cpp:12] ...", also with a rank prefix,
#   "[rank0]:[W1122 ...]" (older torch: "[W socket.cpp:12] ...");
# * gloo's connection report (torch 2.9; gone in 2.13):
#   "[Gloo] Rank 0 is connected to 2 peer ranks. Expected number of connected peer ranks is : 2",
#   and, when a peer has already failed, the list of those it could not reach (seen on torch 2.9.1,
#   as chapter 00's rank 2 raises): "[Gloo] Rank 1 is NOT connected to: [2]".
_ENGINE_LINE = re.compile(
    r"(\[rank\d+\]:)?\[[WIEF](\d{4} |\s)|\[Gloo\] Rank \d+ is (connected to \d+ peer ranks|NOT connected to:)"
)


class EngineLog(logging.Handler):
    """Collects the elastic agent's log records during a launch, instead of printing them."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        text = f"{record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)

    def __enter__(self):
        self._saved = []
        for name in _ENGINE_LOGGERS:
            lg = logging.getLogger(name)
            self._saved.append((lg, lg.level, lg.propagate))
            lg.addHandler(self)
            lg.setLevel(logging.INFO)
            lg.propagate = False
        return self

    def __exit__(self, *exc):
        for lg, level, propagate in self._saved:
            lg.removeHandler(self)
            lg.setLevel(level)
            lg.propagate = propagate


def rank_log(log_dir: Path, rank: int, stream: str) -> str:
    found = sorted(log_dir.glob(f"*/attempt_*/{rank}/{stream}.log"))
    return found[-1].read_text(errors="replace") if found else ""


def engine_line(line: str) -> bool:
    """Whether ``line`` is a c10 log line or gloo's connection report, not the rank's own output."""
    return _ENGINE_LINE.match(line) is not None


def show_rank_output(log_dir: Path, world_size: int) -> None:
    """Print each rank's stdout (then its stderr), prefixed ``[rank r]``, in rank order,
    without the engines' own lines (``engine_line``)."""
    for rank in range(world_size):
        for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            lines = [ln for ln in rank_log(log_dir, rank, stream).splitlines() if not engine_line(ln)]
            if lines:
                sink.write("".join(f"[rank {rank}] {ln}\n" for ln in lines))
    sys.stdout.flush()
    sys.stderr.flush()


@contextlib.contextmanager
def real_stdio():
    """Give the ranks OS-level stdout/stderr while they start.

    The agent sends each forked rank's output to its log file by redirecting
    ``sys.stdout.fileno()``; a notebook's or pytest's capturing stream may have
    no file descriptor, so the process's own standard streams stand in.
    """
    saved = sys.stdout, sys.stderr
    saved[0].flush()
    saved[1].flush()
    with contextlib.ExitStack() as stack:
        sys.stdout, sys.stderr = (
            std if _has_fileno(std) else stack.enter_context(open(os.devnull, "w"))
            for std in (sys.__stdout__, sys.__stderr__)
        )
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


def _has_fileno(stream) -> bool:
    try:
        return stream is not None and stream.fileno() >= 0
    except (OSError, ValueError, AttributeError):
        return False


def current_signal_handlers() -> dict:
    """The agent installs its own handlers in the main thread; remember ours."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}


def restore(env: dict, handlers: dict) -> None:
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
