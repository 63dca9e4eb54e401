"""``launch``: run a function on N ranks from a notebook, on torchrun's own engine.

``torchrun`` is a thin command line around ``elastic_launch`` (the elastic
agent): it starts one process per rank, runs a rendezvous, sets RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT, watches the workers and tears them
down when one fails. ``launch`` calls that same engine with a Python function
as the entry point, and adds what a notebook needs:

* fork start (a function defined in a cell just works, and starts fast), or
  spawn once CUDA is initialised, with a clear error for unimportable functions;
* the process group already initialised in each rank, one CPU thread per rank;
* each rank's prints captured and shown afterwards, grouped in rank order;
* a rank that raises -> ``RankFailedError`` naming it, with its traceback;
* a rank that hangs -> ``LaunchTimeoutError`` after ``timeout`` naming it;
* no worker process left alive, whatever happens (error, timeout, Ctrl-C).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import uuid
import warnings
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ._rank_entry import RankSpec, marker, read_error, run_rank
from .hardware import pick_backend

_ENGINE_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
_C10_LOG_LINE = ("[W", "[I", "[E")  # c10 log lines: "[W1122 15:30:01.1 pid file.cpp:12] ..."


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


def _check_spawnable(fn, args: tuple) -> None:
    """Spawned ranks re-import ``fn`` by name: fail early, and say why, if they can't."""
    main = sys.modules.get("__main__")
    where = getattr(fn, "__module__", None)
    if where == "__main__" and getattr(main, "__file__", None) is None:
        raise LaunchError(
            f"{getattr(fn, '__qualname__', fn)!r} is defined in a notebook cell or an interactive "
            "session, and this launch must use the 'spawn' start method (CUDA is already "
            "initialised in this process, or spawn was requested), which starts fresh "
            "interpreters that cannot see it. Move the function into a .py module and import "
            "it, or restart the kernel and launch before anything touches CUDA (then fork is used).")
    try:
        pickle.dumps((fn, args))
    except Exception as exc:
        raise LaunchError(f"spawn must pickle the function and its arguments, and failed: {exc}. "
                          "Use a module-level function and plain arguments.") from exc


def _start_method(requested: str, fn, args: tuple) -> str:
    if requested not in ("auto", "fork", "spawn"):
        raise ValueError(f"start_method must be 'auto', 'fork' or 'spawn', got {requested!r}")
    method = requested
    if method == "auto":
        fork_ok = "fork" in mp.get_all_start_methods() and not torch.cuda.is_initialized()
        method = "fork" if fork_ok else "spawn"
    if method == "spawn":
        _check_spawnable(fn, args)
    return method


class _EngineLog(logging.Handler):
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


def _rank_log(log_dir: Path, rank: int, stream: str) -> str:
    found = sorted(log_dir.glob(f"*/attempt_*/{rank}/{stream}.log"))
    return found[-1].read_text(errors="replace") if found else ""


def _show_output(log_dir: Path, world_size: int) -> None:
    """Print each rank's stdout (then its stderr), prefixed ``[rank r]``, in rank order."""
    for rank in range(world_size):
        for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            lines = [ln for ln in _rank_log(log_dir, rank, stream).splitlines()
                     if not ln.startswith(_C10_LOG_LINE)]
            if lines:
                sink.write("".join(f"[rank {rank}] {ln}\n" for ln in lines))
    sys.stdout.flush()
    sys.stderr.flush()


def _stop_unfinished(run_dir: Path, world_size: int, before: set) -> None:
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


def _failure(exc: ChildFailedError, run_dir: Path, world_size: int, engine_log: list[str]) -> LaunchError:
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


def _preload_for_fork() -> None:
    """Import, once, what every rank would otherwise import on its own after the fork.

    Building a DistributedDataParallel model imports ``torch._dynamo`` (about a
    second of CPU); imported here, the forked ranks inherit it for free.
    """
    import torch._dynamo  # noqa: F401


def launch(fn, *args, world_size: int = 2, backend: str = "auto", timeout: float = 120.0,
           start_method: str = "auto", init_group: bool = True, threads_per_rank: int = 1,
           show_output: bool = True) -> list:
    """Run ``fn(*args)`` on ``world_size`` ranks; return their results in rank order.

    Inside ``fn`` the default process group is initialised (``init_group=False``
    leaves that to ``fn``; the environment variables are set either way), each
    CPU rank uses ``threads_per_rank`` threads, and a GPU rank has its own
    device selected. ``backend="auto"`` is NCCL when every rank gets a GPU,
    else gloo. After the run, what each rank printed is shown grouped by rank.

    Raises ``RankFailedError`` if a rank raises or dies, ``LaunchTimeoutError``
    if some rank has not returned after ``timeout`` seconds, and
    ``KeyboardInterrupt`` if interrupted; in every case all ranks are stopped.
    """
    backend = pick_backend(world_size, backend)
    method = _start_method(start_method, fn, args)
    if method == "fork":
        _preload_for_fork()
    if timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    run_dir = Path(tempfile.mkdtemp(prefix="course_launch_"))
    spec = RankSpec(str(run_dir), backend, init_group, threads_per_rank, group_timeout_s=timeout + 60)
    config = _launch_config(world_size, method, run_dir, timeout)
    saved_env, saved_signals = dict(os.environ), _current_signal_handlers()
    # Ranks host their own store (rank 0) instead of connecting back to the agent's
    # store in this process: a rank forked while this process's store thread is in
    # the middle of a host-name lookup would inherit glibc's resolver lock, held,
    # and hang at its first lookup (seen ~1 launch in 30 from a Jupyter kernel).
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    children_before = set(mp.active_children())
    timed_out = threading.Event()

    def on_timeout():
        timed_out.set()
        _stop_unfinished(run_dir, world_size, children_before)

    watchdog = threading.Timer(timeout, on_timeout)
    watchdog.daemon = True
    try:
        with _EngineLog() as engine_log, _real_stdio(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
            watchdog.start()
            error = None
            try:
                results = elastic_launch(config, run_rank)(fn, args, spec)
            except ChildFailedError as exc:
                if timed_out.is_set():
                    unfinished = [r for r in range(world_size) if not marker(run_dir, r, "done").exists()]
                    error = LaunchTimeoutError(unfinished, world_size, timeout)
                else:
                    error = _failure(exc, run_dir, world_size, engine_log.lines)
            except SignalException as exc:
                if exc.sigval != signal.SIGINT:
                    raise
                error = KeyboardInterrupt()
        if error is not None:
            # Raised here, outside the except blocks, so that the error does not keep the
            # agent's traceback (and its store, sockets and threads) alive as its context.
            raise error
        return [results[rank] for rank in range(world_size)]
    finally:
        watchdog.cancel()
        _stop_unfinished(run_dir, world_size, children_before)
        mp.active_children()  # reap whatever was stopped, so no zombie is left either
        _restore(saved_env, saved_signals)
        if show_output:
            _show_output(run_dir / "logs", world_size)
        shutil.rmtree(run_dir, ignore_errors=True)


def _launch_config(world_size: int, start_method: str, run_dir: Path, timeout: float) -> LaunchConfig:
    """torchrun's settings for one node, as ``torchrun --standalone`` would choose them."""
    settings = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=uuid.uuid4().hex,
        # numeric address: no DNS lookups; port 0: a free port every time, so re-runs never clash
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", local_addr="127.0.0.1",
        rdzv_configs={"timeout": max(int(timeout), 30)}, max_restarts=0, monitor_interval=0.02,
        start_method=start_method, logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs"), redirects=Std.ALL),
        shutdown_timeout=5)  # ranks die at once on SIGTERM anyway; newer torch only
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return LaunchConfig(**{k: v for k, v in settings.items() if k in known})


@contextlib.contextmanager
def _real_stdio():
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
            for std in (sys.__stdout__, sys.__stderr__))
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


def _has_fileno(stream) -> bool:
    try:
        return stream is not None and stream.fileno() >= 0
    except (OSError, ValueError, AttributeError):
        return False


def _current_signal_handlers() -> dict:
    """The agent installs its own handlers in the main thread; remember ours."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}


def _restore(env: dict, handlers: dict) -> None:
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
