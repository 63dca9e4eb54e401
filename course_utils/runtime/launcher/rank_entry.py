"""What each rank runs first, inside the worker process that ``launch`` starts.

torchrun's engine (the elastic agent) starts the process, sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, and sends file
descriptors 1 and 2 to this rank's log files. ``run_rank`` then prepares the
rank (signals, threads, device, process group), calls the user's function and
leaves small marker files in ``run_dir`` that the parent reads:
``rank<r>.pid`` (started), ``rank<r>.result`` (what the function returned, pickled),
``rank<r>.done`` (returned), ``rank<r>.error`` (the user's traceback).

The result goes back in a file, not through the engine's return queue: a rank stopped half way
through putting a large result in that queue (the launch's timeout stops every rank) would leave
the engine waiting forever for the rest of it.

Taught in chapter 00 (appendix 00a, section 6a: ``run_rank``).
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import signal
import sys
import traceback
import types
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import cloudpickle

from course_utils.runtime.loopback import host_rank_store_on_loopback


@dataclass(frozen=True)
class RankSpec:
    """How to prepare each rank; built by ``launch`` and sent to every rank."""

    run_dir: str
    backend: str
    init_group: bool
    threads: int
    group_timeout_s: float
    cluster_json: str | None = None  # a course_utils.Cluster as JSON: the rank runs in its virtual time


def marker(run_dir: str | Path, rank: int, kind: str) -> Path:
    """Path of rank ``rank``'s marker file of ``kind`` ("pid", "result", "done" or "error")."""
    return Path(run_dir) / f"rank{rank}.{kind}"


def finished(run_dir: str | Path, rank: int) -> bool:
    """Whether rank ``rank``'s function has returned."""
    return marker(run_dir, rank, "done").exists()


def _write(path: Path, content: str | bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    if isinstance(content, bytes):
        tmp.write_bytes(content)
    else:
        tmp.write_text(content)
    os.replace(tmp, path)  # atomic: the parent never reads half a file


def read_result(run_dir: str | Path, rank: int):
    """What rank ``rank``'s function returned (``run_rank`` left it in ``rank<r>.result``)."""
    return pickle.loads(marker(run_dir, rank, "result").read_bytes())


def _use_redirected_stdio() -> None:
    """Point ``print`` at fd 1/2, which the agent redirected to this rank's logs.

    Forked from a notebook, ``sys.stdout`` is still the kernel's stream and would
    send this rank's prints straight to the notebook, interleaved with the other
    ranks'. Rebinding to the file descriptors keeps each rank's output apart.
    """
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the user's function down, without this module's frame."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _select_gpu(torch, local_rank: int) -> None:
    try:
        torch.cuda.set_device(local_rank)
    except RuntimeError as exc:
        if "forked subprocess" not in str(exc):
            raise
        raise RuntimeError(
            "this rank was forked from a process that had already initialised CUDA without torch "
            "knowing (torch.cuda.is_available() does so unless PYTORCH_NVML_BASED_CUDA_CHECK=1 was set "
            "first; importing course_utils sets it), and a forked child cannot use CUDA. Pass "
            "start_method='spawn' to launch, or restart the kernel and import course_utils first."
        ) from exc


def run_rank(payload, spec: RankSpec) -> None:
    """Prepare this rank, run the function in ``payload`` and leave its result for the launcher.

    ``payload`` is ``(fn, args)``: as it is in a forked rank, which inherits them;
    pickled by ``cloudpickle`` (bytes) in a spawned rank, since cloudpickle sends
    a function defined in a notebook cell by value, where pickle would only send its name.
    The result goes back pickled, every tensor in it moved to the CPU
    (``result_bytes``), in ``rank<r>.result`` (``read_result``): the notebook never receives a
    CUDA tensor, and the engine's return queue carries only ``None``.
    """
    # details: prepare the process: freeze inherited garbage, die at once when stopped, print to its log
    # A forked rank inherits the parent's objects, garbage included (say, the store
    # of an earlier launch). Collected here, a native destructor would join threads
    # this process does not have, and abort it. Freezing leaves them to the parent.
    gc.freeze()
    # Die at once when the launcher stops us (a rank blocked in a collective
    # never returns to Python, so a Python-level handler would never run).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _use_redirected_stdio()
    # end details
    rank = int(os.environ["RANK"])
    _write(marker(spec.run_dir, rank, "pid"), str(os.getpid()))

    import torch
    import torch.distributed as dist

    if spec.backend == "nccl":
        _select_gpu(torch, int(os.environ["LOCAL_RANK"]))
    torch.set_num_threads(spec.threads)  # NCCL ranks too: the CPU side of their work shares the cores
    try:
        fn, args = pickle.loads(payload) if isinstance(payload, bytes) else payload
        backend = _backend(spec)  # a cluster, if any, is installed for fn's own groups too
        host_rank_store_on_loopback()  # rank 0's store, gloo and NCCL listen on loopback only
        if spec.init_group:
            dist.init_process_group(backend, timeout=timedelta(seconds=spec.group_timeout_s))
        result = fn(*args)
        _write(marker(spec.run_dir, rank, "result"), result_bytes(result))
    except BaseException as exc:
        # details: leave the exception and its traceback in rank<r>.error for the launcher
        _write(
            marker(spec.run_dir, rank, "error"), f"{type(exc).__name__}\n{exc}\n\x00{_user_traceback(exc)}"
        )
        # end details
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    _write(marker(spec.run_dir, rank, "done"), "")
    if dist.is_initialized():
        # details: wait until every rank has returned, then destroy the process group
        # Tear the group down only once every rank has returned: closing our end
        # early would turn a peer that is still (or forever) waiting for us into
        # a "connection reset" error instead of the hang it really is.
        _wait_for_all_done(spec.run_dir, dist.get_world_size())
        dist.destroy_process_group()
        # end details


def _backend(spec: RankSpec) -> str:
    """The backend string this rank's group starts with: gloo, ``"cpu:gloo,cuda:nccl"``, or the
    modeled cluster (``launch(..., cluster=...)``), installed here so that ``fn``'s own groups
    may use it too."""
    from course_utils.runtime.hardware import group_backend

    if spec.cluster_json is not None:
        from course_utils.runtime.cluster import Cluster, install

        return install(Cluster.from_json(spec.cluster_json))
    return group_backend(spec.backend)


class _CPUPickler(cloudpickle.Pickler):
    """A pickler that writes every tensor as a CPU tensor (parameters stay parameters).

    cloudpickle's, not pickle's: a spawned rank rebuilt the notebook's cell classes and
    functions from their value (``launch`` sends them so), and its own ``__main__`` has no
    such names, so what it returns of them must go back by value too. What ``__main__``
    here does hold (in a forked rank, the notebook's own) still goes by name, as pickle
    would send it, so the notebook gets its own class back.
    """

    PROTOCOL = pickle.HIGHEST_PROTOCOL

    def reducer_override(self, obj):
        import torch

        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            if isinstance(obj, torch.nn.Parameter):
                return torch.nn.Parameter, (obj.detach().cpu(), obj.requires_grad)
            copy = obj.detach().cpu().requires_grad_(obj.requires_grad) if obj.is_leaf else obj.cpu()
            return copy.__reduce_ex__(self.PROTOCOL)
        if _found_in_main(obj):
            return NotImplemented  # by name, as pickle does
        return super().reducer_override(obj)


def _found_in_main(obj) -> bool:
    """Whether ``obj`` is a class or function of ``__main__`` that its name finds there."""
    if not isinstance(obj, (type, types.FunctionType)) or obj.__module__ != "__main__":
        return False
    found = sys.modules.get("__main__")
    for name in obj.__qualname__.split("."):
        found = getattr(found, name, None)
    return found is obj


def to_rank_gpu(tensor):
    """A tensor the notebook sent from a GPU to a spawned NCCL rank, put on this rank's GPU.

    ``launch`` sends it as a CPU copy (sent as it is, torch would restore it on the GPU it
    was on in the notebook, the same one in every rank); ``run_rank`` has selected this
    rank's GPU before it unpickles the arguments. A parameter stays a parameter.
    """
    import torch

    moved = tensor.detach().to(torch.device("cuda", torch.cuda.current_device()))
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(moved, tensor.requires_grad)
    return moved.requires_grad_(tensor.requires_grad)


def result_bytes(result) -> bytes:
    """``result`` pickled with every tensor in it, however deeply nested, on the CPU.

    Raises ``ResultNotSent`` (naming what could not be pickled) instead of the
    bare pickling error.
    """
    buffer = io.BytesIO()
    try:
        _CPUPickler(buffer, protocol=_CPUPickler.PROTOCOL).dump(result)
    except Exception as exc:
        raise ResultNotSent(
            "the function returned, but its result cannot be pickled to be sent back to the launcher "
            f"({type(exc).__name__}: {exc}): return tensors, numbers, strings, lists or dicts of them, "
            "not locks, generators, modules holding process groups or open files"
        ) from exc
    return buffer.getvalue()


class ResultNotSent(RuntimeError):
    """A rank's function returned something that cannot be sent back (it cannot be pickled)."""


def _wait_for_all_done(run_dir: str, world_size: int) -> None:
    """Poll the markers until every rank has returned (the launcher stops us on a timeout)."""
    import time

    while not all(finished(run_dir, r) for r in range(world_size)):
        time.sleep(0.005)


def read_error(run_dir: str | Path, rank: int) -> tuple[str, str, str] | None:
    """``(exception type, message, traceback)`` a rank recorded, or None."""
    path = marker(run_dir, rank, "error")
    if not path.exists():
        return None
    head, _, tb = path.read_text().partition("\x00")
    exc_type, _, message = head.partition("\n")
    return exc_type, message.rstrip("\n"), tb
