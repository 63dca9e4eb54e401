"""Which devices the ranks use, and which communication backend that implies.

The course never writes ``cuda:0``: code asks ``devices(n)`` for n devices and
gets distinct GPUs when the machine has enough, else CPU stand-ins. The same
rule picks the backend: NCCL needs one GPU per rank, gloo runs anywhere.

Taught in chapter 00 (section 2, devices: real GPUs or CPU stand-ins) and chapter 02 (backends).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.distributed as dist

from course_utils.runtime import compat, nvml
from course_utils.runtime.checks import check_whole

BACKENDS = ("gloo", "nccl", "mpi")


def gpu_count() -> int:
    """Number of CUDA GPUs this process can see (honours ``CUDA_VISIBLE_DEVICES``).

    Does not initialise CUDA, so the process can still fork ranks that use
    their own GPU. ``torch.cuda.is_available()`` would initialise it (unless
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set); this asks NVML, the driver's
    management library, as that variable makes torch do. Where NVML cannot
    answer, a short-lived child process asks CUDA instead, and this one stays clean.
    """
    if not compat.cuda_compiled():  # a CPU build of PyTorch
        return 0
    if torch.cuda.is_initialized():  # too late to keep clean: ask CUDA
        return torch.cuda.device_count()
    count = compat.gpu_count_from_driver()  # NVML (AMD: amdsmi); -1 if it cannot answer
    return count if count >= 0 else len(_gpu_names_from_child())


def gpu_names() -> list[str]:
    """Names of the GPUs ``cuda:0, cuda:1, ...`` (empty without GPUs), without initialising CUDA."""
    if gpu_count() == 0:
        return []
    if torch.cuda.is_initialized():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found = nvml.visible_gpus()
    return [gpu.name for gpu in found] if found is not None else _gpu_names_from_child()


_child_answers: dict = {}


def _gpu_names_from_child() -> list[str]:
    """GPU names as a fresh interpreter's CUDA sees them (cached per ``CUDA_VISIBLE_DEVICES``)."""
    key = os.environ.get("CUDA_VISIBLE_DEVICES")
    if key not in _child_answers:
        code = (
            "import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
            "print('\\n'.join(torch.cuda.get_device_name(i) for i in range(n)))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        _child_answers[key] = [line for line in done.stdout.splitlines() if line.strip()]
    return _child_answers[key]


def devices(n: int, quiet: bool = False) -> list[torch.device]:
    """Return ``n`` devices: ``cuda:0 .. cuda:n-1`` if there are n GPUs, else n CPU stand-ins.

    A CPU stand-in is ``torch.device("cpu")``: code written for several devices
    runs unchanged, one "device" per list entry, so a learner without GPUs can
    follow every chapter. Prints a one-line note saying which (``quiet=True``
    silences it).
    """
    check_whole("devices(n): n", n)
    gpus = gpu_count()
    if gpus >= n:
        chosen = [torch.device("cuda", i) for i in range(n)]
        note = f"{n} GPU(s): " + ", ".join(str(d) for d in chosen)
    else:
        chosen = [torch.device("cpu")] * n
        why = "no GPU here" if gpus == 0 else f"only {gpus} GPU(s) here"
        note = f"{n} CPU stand-in(s) ({why}; on a machine with {n} GPUs this gives cuda:0..cuda:{n - 1})"
    if not quiet:
        print(f"devices({n}): {note}")
    return chosen


def pick_backend(world_size: int, backend: str = "auto") -> str:
    """The process-group backend for ``world_size`` ranks on this machine.

    ``"auto"`` gives ``"nccl"`` when every rank can have its own GPU, else
    ``"gloo"``. An explicit backend is checked: NCCL with fewer GPUs than ranks,
    or MPI without an MPI build of PyTorch, raises a ValueError saying what to
    use instead.
    """
    check_whole("world_size", world_size)
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown backend {backend!r}; choose one of 'auto', " + ", ".join(map(repr, BACKENDS))
        )
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus == 0:
            raise ValueError(
                "backend='nccl' needs CUDA GPUs and this machine has none; "
                "use backend='gloo' (or 'auto'), which runs on CPU"
            )
        if gpus < world_size:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: world_size={world_size} but only "
                f"{gpus} GPU(s) are visible. Use world_size<={gpus}, or backend='gloo'"
            )
    if backend == "mpi" and not dist.is_mpi_available():
        raise ValueError(
            "backend='mpi' needs PyTorch built from source with MPI; this build has none. "
            "Use backend='gloo' (CPU) or 'nccl' (GPUs)"
        )
    return backend


def group_backend(backend: str) -> str:
    """The backend string to start a process group with, for a backend ``pick_backend`` chose.

    An NCCL group serves CUDA tensors only ("No backend type associated with
    device type cpu"), yet ranks also exchange small CPU tensors (a seed, a
    count, an object). ``"cpu:gloo,cuda:nccl"`` starts both: CUDA tensors go
    through NCCL, CPU tensors through gloo.
    """
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def torchrun_rank_backend() -> str:
    """In a rank that torchrun started: the backend for its process group (NCCL when each of the
    node's ``LOCAL_WORLD_SIZE`` ranks can have a GPU; ``COURSE_BACKEND=gloo``, which stand-in nodes
    sharing GPUs get, forces gloo), with the rank prepared for it: its GPU selected
    (``LOCAL_RANK``) under NCCL, one CPU thread otherwise (the ranks share this machine's cores)."""
    backend = pick_backend(
        int(os.environ.get("LOCAL_WORLD_SIZE", "1")), os.environ.get("COURSE_BACKEND", "auto")
    )
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)
    return backend


def uses_nccl(group=None) -> bool:
    """Whether ``group`` (default: the whole world) sends CUDA tensors through NCCL."""
    return dist.is_initialized() and "nccl" in str(dist.get_backend(group))


def rank_device() -> torch.device:
    """This rank's device once its group is up: its own GPU under NCCL, else the CPU.

    ``launch`` and the course's torchrun scripts select each NCCL rank's GPU
    (``torch.cuda.set_device(LOCAL_RANK)``) before the group starts.
    """
    if uses_nccl():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
