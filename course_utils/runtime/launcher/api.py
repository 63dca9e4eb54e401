"""``launch``: run a function on N ranks from a notebook, on torchrun's own engine.

``torchrun`` is a thin command line around ``elastic_launch`` (the elastic
agent): it starts one process per rank, runs a rendezvous, sets RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT, watches the workers and tears them
down when one fails. ``launch`` calls that same engine with a Python function
as the entry point, and adds what a notebook needs:

* fork start (a function defined in a cell just works, and starts fast), or
  spawn once CUDA is initialised, and on macOS (the function sent by value with
  cloudpickle, so a cell's function works there too);
* the process group already initialised in each rank (``"cpu:gloo,cuda:nccl"``
  under NCCL, so CPU tensors work too), one CPU thread per rank;
* results returned with every tensor on the CPU;
* each rank's prints captured and shown afterwards, grouped in rank order;
* a rank that raises -> ``RankFailedError`` naming it, with its traceback;
* a rank that hangs -> ``LaunchTimeoutError`` after ``timeout`` naming it;
* no worker process left alive, nor anything a rank started, whatever happens (error, timeout,
  Ctrl-C; ``stop_unfinished``);
* nothing listening beyond loopback: the agent's rendezvous store is a file, not a port, and the
  ranks' store, gloo and NCCL listen on 127.0.0.1 (``runtime.loopback``).

Taught in chapter 00 (``launch``), appendix 00a (fork or spawn, ``_start_method``) and
chapter 02 (beside ``torchrun``).
"""

from __future__ import annotations

import dataclasses
import io
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

import cloudpickle
import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from course_utils.runtime import compat, process_tree
from course_utils.runtime.hardware import pick_backend
from course_utils.runtime.launcher.errors import (
    LaunchError,
    LaunchTimeoutError,
    RankFailedError,
    diagnose_failure,
    stop_unfinished,
)
from course_utils.runtime.launcher.output import (
    EngineLog,
    current_signal_handlers,
    real_stdio,
    restore,
    show_rank_output,
)
from course_utils.runtime.launcher.rank_entry import RankSpec, finished, read_result, run_rank, to_rank_gpu

__all__ = ["launch", "LaunchError", "LaunchTimeoutError", "RankFailedError"]


class _PayloadPickler(cloudpickle.Pickler):
    """cloudpickle, sending each tensor that is not on the CPU as a CPU copy.

    Sent as it is, a CUDA tensor would come back in every spawned rank on the GPU it is on
    here (torch pickles its device index), not on the rank's own ``rank_device()``. So it
    arrives on the CPU, where a gloo rank computes, and an NCCL rank (``gpu_ranks``) moves
    it to its GPU (``to_rank_gpu``).
    """

    def __init__(self, file, gpu_ranks: bool):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.gpu_ranks = gpu_ranks

    def reducer_override(self, obj):
        if not isinstance(obj, torch.Tensor) or obj.device.type == "cpu":
            return super().reducer_override(obj)
        copy = obj.detach().cpu().requires_grad_(obj.requires_grad)
        if isinstance(obj, torch.nn.Parameter):
            copy = torch.nn.Parameter(copy, obj.requires_grad)
        return (to_rank_gpu, (copy,)) if self.gpu_ranks else copy.__reduce_ex__(self.proto)


def _spawn_payload(fn, args: tuple, backend: str) -> bytes:
    """``(fn, args)`` pickled for spawned ranks, which start as fresh interpreters.

    Plain pickle sends a function by name, and a spawned interpreter cannot find
    one defined in a notebook cell; cloudpickle (which Ray, Dask and PySpark rely
    on) sends such a function by value, with the globals it uses. A tensor on a
    GPU arrives on each rank's own device (``_PayloadPickler``).
    """
    buffer = io.BytesIO()
    try:
        _PayloadPickler(buffer, gpu_ranks=backend == "nccl").dump((fn, args))
    except Exception as exc:
        raise LaunchError(
            f"this launch starts its ranks with 'spawn' (CUDA is already initialised in this process, "
            f"or spawn was requested), which must pickle the function and its arguments, and that "
            f"failed: {type(exc).__name__}: {exc}. Pass plain arguments (tensors, numbers, strings, "
            "lists, dicts) and let the function build the rest (models, files, locks, process groups) "
            "inside each rank; or restart the kernel and launch before anything touches CUDA "
            "(then fork is used and nothing is pickled)."
        ) from exc
    return buffer.getvalue()


def _start_method(requested: str) -> str:
    """``"fork"`` or ``"spawn"``: ``requested``, or for ``"auto"`` fork only where it is safe.

    A process that has initialised CUDA cannot fork ranks that use it, and on macOS Python
    itself spawns by default (since 3.8: its system libraries may start threads that a
    forked child does not get).
    """
    if requested not in ("auto", "fork", "spawn"):
        raise ValueError(f"start_method must be 'auto', 'fork' or 'spawn', got {requested!r}")
    method = requested
    if method == "auto":
        fork_ok = (
            "fork" in mp.get_all_start_methods()
            and sys.platform != "darwin"
            and not torch.cuda.is_initialized()
        )
        method = "fork" if fork_ok else "spawn"
    return method


POSIX_SIGNALS = ("SIGKILL", "SIGHUP", "SIGQUIT")


def _check_platform() -> None:
    """Refuse, with the way out, a platform without the POSIX signals the launcher relies on.

    The engine and ``stop_unfinished`` end ranks with SIGKILL and save and restore the
    handlers of SIGHUP and SIGQUIT; native Windows has none of them.
    """
    missing = [name for name in POSIX_SIGNALS if not hasattr(signal, name)]
    if missing:
        raise LaunchError(
            f"launch needs POSIX signals, and {', '.join(missing)} do not exist on this platform "
            f"({sys.platform}): run the course on Linux or Windows through WSL "
            "(the Windows Subsystem for Linux), or on Colab or Kaggle"
        )


def _preload_for_fork() -> None:
    """Import, once, what every rank would otherwise import on its own after the fork.

    Building a DistributedDataParallel model imports ``torch._dynamo`` (about a
    second of CPU); imported here, the forked ranks inherit it for free.
    """
    compat.import_dynamo()


def launch(
    fn,
    *args,
    world_size: int = 2,
    backend: str = "auto",
    timeout: float = 120.0,
    start_method: str = "auto",
    init_group: bool = True,
    threads_per_rank: int = 1,
    show_output: bool = True,
    cluster=None,
) -> list:
    """Run ``fn(*args)`` on ``world_size`` ranks; return their results in rank order.

    Inside ``fn`` the default process group is initialised (``init_group=False``
    leaves that to ``fn``; the environment variables are set either way), each
    CPU rank uses ``threads_per_rank`` threads, and a GPU rank has its own
    device selected. ``backend="auto"`` is NCCL when every rank gets a GPU,
    else gloo. After the run, what each rank printed is shown grouped by rank.

    ``cluster`` (a ``course_utils.Cluster``): the ranks run on that modeled GPU cluster, in its
    virtual time (``course_utils.runtime.cluster``): CPU ranks over gloo, whatever GPUs the
    machine has, every operator and collective priced on the modeled devices and network.

    Raises ``RankFailedError`` if a rank raises or dies, ``LaunchTimeoutError``
    if some rank has not returned after ``timeout`` seconds, and
    ``KeyboardInterrupt`` if interrupted; in every case all ranks are stopped.
    """
    _check_platform()
    if timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    cluster_json = _cluster_json(cluster, backend)
    backend = "gloo" if cluster is not None else pick_backend(world_size, backend)
    method = _start_method(start_method)
    if method == "fork":
        _preload_for_fork()
        payload = (fn, args)
    else:
        payload = _spawn_payload(fn, args, backend)
    run_dir = Path(tempfile.mkdtemp(prefix="course_launch_"))
    spec = RankSpec(
        str(run_dir),
        backend,
        init_group,
        threads_per_rank,
        group_timeout_s=timeout + 60,
        cluster_json=cluster_json,
    )
    config = _launch_config(world_size, method, run_dir, timeout)
    saved_env, saved_signals = dict(os.environ), current_signal_handlers()
    # Ranks host their own store (rank 0) instead of connecting back to the agent's
    # store in this process: a rank forked while this process's store thread is in
    # the middle of a host-name lookup would inherit glibc's resolver lock, held,
    # and hang at its first lookup (seen ~1 launch in 30 from a Jupyter kernel).
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Plain tracebacks: Jupyter sets FORCE_COLOR, and Python 3.13 then colours them (ANSI codes)
    os.environ["PYTHON_COLORS"] = "0"
    # Whatever the ranks start inherits this mark, so that it is found and stopped even orphaned
    os.environ.update(process_tree.new_mark())
    children_before = set(mp.active_children())
    timed_out, stuck = threading.Event(), []

    def on_timeout():  # every rank still running is stopped, even one whose function returned
        timed_out.set()
        stuck.extend(stop_unfinished(run_dir, world_size, children_before, finished_too=True))

    watchdog = threading.Timer(timeout, on_timeout)
    watchdog.daemon = True
    try:
        with EngineLog() as engine_log, real_stdio(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
            watchdog.start()
            error = None
            try:
                elastic_launch(config, run_rank)(payload, spec)
            except ChildFailedError as exc:
                if timed_out.is_set():
                    unfinished = [r for r in range(world_size) if not finished(run_dir, r)]
                    error = LaunchTimeoutError(unfinished, world_size, timeout, stuck)
                else:
                    error = diagnose_failure(exc, run_dir, world_size, engine_log.lines)
            except SignalException as exc:
                if exc.sigval != signal.SIGINT:
                    raise
                error = KeyboardInterrupt()
        if error is not None:
            # Raised here, outside the except blocks, so that the error does not keep the
            # agent's traceback (and its store, sockets and threads) alive as its context.
            raise error
        return [read_result(run_dir, rank) for rank in range(world_size)]
    finally:
        watchdog.cancel()
        # the agent has returned: no rank should be running; stop what is, and what they started
        stop_unfinished(run_dir, world_size, children_before, finished_too=True)
        mp.active_children()  # reap whatever was stopped, so no zombie is left either
        restore(saved_env, saved_signals)
        if show_output:
            show_rank_output(run_dir / "logs", world_size)
        shutil.rmtree(run_dir, ignore_errors=True)


def _cluster_json(cluster, backend: str) -> str | None:
    """The cluster as the ranks receive it, or None; refuses what cannot go with it."""
    if cluster is None:
        return None
    from course_utils.runtime.cluster import Cluster

    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a course_utils.Cluster (or None), got {type(cluster).__name__}")
    if backend not in ("auto", "gloo"):
        raise LaunchError(
            f"a modeled cluster runs its ranks on the CPU over gloo, whatever GPUs this machine has; "
            f"leave backend at 'auto' (got {backend!r})"
        )
    return cluster.to_json()


def _launch_config(world_size: int, start_method: str, run_dir: Path, timeout: float) -> LaunchConfig:
    """torchrun's settings for one node, as ``torchrun --standalone`` would choose them."""
    settings = dict(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=uuid.uuid4().hex,
        # The rendezvous store is a file in this launch's private folder, not a TCP server: the
        # agent, in this process, listens on no port (a TCPStore would listen on every interface,
        # and the agent unpickles what it reads from it; runtime/loopback.py)
        rdzv_backend="c10d",
        rdzv_endpoint=str(run_dir / "rendezvous"),
        local_addr="127.0.0.1",  # numeric: no DNS lookups; the ranks' store is on loopback
        rdzv_configs={"timeout": max(int(timeout), 30), "store_type": "file"},
        max_restarts=0,
        monitor_interval=0.02,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs"), redirects=Std.ALL),
        shutdown_timeout=5,
    )  # ranks die at once on SIGTERM anyway; newer torch only
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return LaunchConfig(**{k: v for k, v in settings.items() if k in known})
