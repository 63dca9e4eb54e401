"""Tiny rank functions that live in a module, so every start method can import them.

Functions defined in a notebook cell work with ``launch`` under fork; these are
for the cases that need an importable function (spawn, ``mp.spawn``, scripts).

Taught in chapter 00 (appendix 00a: ``spawned_all_reduce`` under ``torch.multiprocessing.spawn``
in section 3, launches timed on ``sum_of_ranks`` in section 6b).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from course_utils.runtime.hardware import rank_device


def hello() -> str:
    """Say who we are: ``"rank r of w (backend)"``; prints the same line."""
    line = f"rank {dist.get_rank()} of {dist.get_world_size()} ({dist.get_backend()})"
    print(line)
    return line


def sum_of_ranks() -> float:
    """One all_reduce of each rank's number: returns 0 + 1 + ... + (w - 1) on every rank."""
    t = torch.tensor([float(dist.get_rank())], device=rank_device())  # NCCL: on this rank's GPU
    dist.all_reduce(t)
    return t.item()


def spawned_all_reduce(index: int, world_size: int, port: int, results) -> None:
    """An entry point for ``torch.multiprocessing.spawn``, which calls ``fn(index, *args)``.

    That launcher sets no environment and forms no group, so this function does both itself,
    and it returns nothing the launcher would keep: it puts ``(rank, sum)`` on ``results``.
    """
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # where rank 0 hosts the rendezvous store
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=index, world_size=world_size)  # env:// for the address
    t = torch.tensor([index + 1.0])
    dist.all_reduce(t)
    results.put((index, t.item()))
    dist.destroy_process_group()
