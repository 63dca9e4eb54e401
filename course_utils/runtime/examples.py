"""Tiny rank functions that live in a module, so every start method can import them.

Functions defined in a notebook cell work with ``launch`` under fork; these are
for the cases that need an importable function (spawn, ``mp.spawn``, scripts).

Taught in chapter 00 (appendix 00a, section 4: launches timed on ``sum_of_ranks``).
"""

from __future__ import annotations

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
