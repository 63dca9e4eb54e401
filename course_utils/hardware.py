"""Which devices the ranks use, and which communication backend that implies.

The course never writes ``cuda:0``: code asks ``devices(n)`` for n devices and
gets distinct GPUs when the machine has enough, else CPU stand-ins. The same
rule picks the backend: NCCL needs one GPU per rank, gloo runs anywhere.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl", "mpi")


def gpu_count() -> int:
    """Number of CUDA GPUs this process can see (honours ``CUDA_VISIBLE_DEVICES``).

    Does not initialise CUDA, so it is safe to call before forking ranks.
    """
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def devices(n: int, quiet: bool = False) -> list[torch.device]:
    """Return ``n`` devices: ``cuda:0 .. cuda:n-1`` if there are n GPUs, else n CPU stand-ins.

    A CPU stand-in is ``torch.device("cpu")``: code written for several devices
    runs unchanged, one "device" per list entry, so a learner without GPUs can
    follow every chapter. Prints a one-line note saying which (``quiet=True``
    silences it).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"devices(n) needs a positive whole number of devices, got {n!r}")
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
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive whole number, got {world_size!r}")
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of 'auto', " + ", ".join(map(repr, BACKENDS)))
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus == 0:
            raise ValueError("backend='nccl' needs CUDA GPUs and this machine has none; "
                             "use backend='gloo' (or 'auto'), which runs on CPU")
        if gpus < world_size:
            raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but only "
                             f"{gpus} GPU(s) are visible. Use world_size<={gpus}, or backend='gloo'")
    if backend == "mpi" and not dist.is_mpi_available():
        raise ValueError("backend='mpi' needs PyTorch built from source with MPI; this build has none. "
                         "Use backend='gloo' (CPU) or 'nccl' (GPUs)")
    return backend


def rank_device() -> torch.device:
    """This rank's device once its group is up: its own GPU under NCCL, else the CPU.

    ``launch`` and the course's torchrun scripts select each NCCL rank's GPU
    (``torch.cuda.set_device(LOCAL_RANK)``) before the group starts.
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
