"""Replicated state (DDP: every rank has the same model): rank 0 saves, every rank loads.

Rank 0 writes one file with ``torch.save`` between two barriers (``save_on_rank0``),
under a temporary name, synced to the disk, then renamed, so a rank killed mid-save never leaves half a
checkpoint; every rank reads it back (``load_on_every_rank``). ``training_state`` holds
all the next step depends on: weights, optimizer state, the data position
(``ResumableSampler``: the epoch and how many of its samples were used), step count
and random state.

Taught in chapter 08 (sections 1 and 2).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

__all__ = [
    "save_on_rank0",
    "load_on_every_rank",
    "ResumableSampler",
    "training_state",
    "restore_training_state",
]


def save_on_rank0(state: dict, path: str | os.PathLike) -> None:
    """Every rank calls this; rank 0 writes ``state`` to ``path`` (atomically).

    The first barrier makes sure every rank has finished the step being saved; the
    second that no rank goes on to read (or to crash) before the file is complete.
    The file is written under a temporary name, flushed to the disk (``fsync``), then
    renamed over the old one (``os.replace``, atomic), and the folder is synced so that
    the rename itself survives a power loss: at every moment the path holds the old
    checkpoint or the new one, complete.
    """
    dist.barrier()
    if dist.get_rank() == 0:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on the disk before the name points at them
            os.replace(tmp, path)  # atomic: the old checkpoint or the new one, never half of one
        finally:
            tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves no half file behind
        _fsync_folder(path.parent)  # ... and the new name is on the disk too
    dist.barrier()


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename) to the disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_on_every_rank(path: str | os.PathLike, map_location="cpu") -> dict | None:
    """The checkpoint at ``path`` (tensors only: ``weights_only=True``), or None if there is none."""
    if not Path(path).exists():
        return None
    return torch.load(path, map_location=map_location, weights_only=True)


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` that can start in the middle of an epoch.

    ``DistributedSampler`` shuffles with ``seed + epoch`` (call ``set_epoch`` every epoch)
    and gives each rank every ``W``-th index. This subclass also counts the samples this
    rank has consumed (``advance(n)`` after each batch), saves ``{epoch, consumed}`` in
    ``state_dict()``, and after ``load_state_dict`` skips the consumed ones: the resumed
    run sees exactly the batches the interrupted run had not seen.
    """

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, **kwargs)
        self.consumed = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.consumed = 0
        super().set_epoch(epoch)

    def advance(self, n: int) -> None:
        self.consumed += n

    def __iter__(self):
        return iter(list(super().__iter__())[self.consumed :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.consumed)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def training_state(model, optimizer, sampler: ResumableSampler, step: int) -> dict:
    """What a replicated (DDP) run needs to continue: weights, optimizer state, data position,
    step count, and this rank's CPU random state (``torch.get_rng_state()``; rank 0 saves it and
    every rank restores it, enough for a model that draws nothing random while it trains)."""
    return {
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.state_dict(),
        "step": step,
        "rng": torch.get_rng_state(),
    }


def restore_training_state(state: dict, model, optimizer, sampler: ResumableSampler) -> int:
    """Put a :func:`training_state` back; returns the step it was saved at."""
    unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"].cpu())
    return int(state["step"])
