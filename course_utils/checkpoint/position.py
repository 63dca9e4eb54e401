"""A data position that survives a change of world size: the global sample count.

``DistributedSampler`` gives rank ``r`` of ``W`` the positions ``r, r + W, r + 2W, ...`` of
the epoch's shuffled order. After every rank has consumed ``c`` samples, the ranks together
have consumed exactly the first ``c * W`` positions of that order, whatever ``W`` was. So a
checkpoint that stores the **global** count ``g = c * W`` (with the epoch) can be resumed by
any number of ranks: the new ``W'`` ranks deal out the rest of the order, ``order[g:]``, in
the same round-robin way. No sample is skipped or seen twice. (A per-rank count, as
``ResumableSampler`` stores, means nothing once ``W`` has changed.)

Taught in chapter 08 (section 4, a checkpoint that any number of ranks can resume).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["GlobalPositionSampler"]


class GlobalPositionSampler:
    """The indices of rank ``rank`` of ``world_size`` for one epoch, from a global position on.

    ``n``: samples in the dataset. Each epoch's order is ``torch.randperm(n)`` drawn with
    ``seed + epoch``, as ``DistributedSampler(shuffle=True)`` draws it (independent of the world
    size); rank ``r`` takes every ``W``-th index of what is left, starting at ``r``, and the
    last ``< W`` indices of an epoch are dropped (``drop_last``). ``advance(b)`` after each
    batch of ``b`` samples per rank adds ``b * W`` to the global count. ``state_dict()`` is
    ``{"epoch", "samples_seen"}``: the same on every rank, so one copy is saved.
    """

    def __init__(self, n: int, *, seed: int = 0, rank: int | None = None, world_size: int | None = None):
        if n <= 0:
            raise ValueError(f"the dataset must hold at least one sample, got n={n}")
        self.n, self.seed = n, seed
        self.rank = dist.get_rank() if rank is None else rank
        self.world_size = dist.get_world_size() if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in range(world_size={self.world_size})")
        self.epoch, self.samples_seen = 0, 0

    def order(self) -> torch.Tensor:
        """This epoch's shuffled order of all ``n`` indices ``[n]`` (the same on every rank)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=generator)

    def __iter__(self):
        rest = self.order()[self.samples_seen :]
        per_rank = len(rest) // self.world_size
        return iter(rest[self.rank :: self.world_size][:per_rank].tolist())

    def __len__(self) -> int:
        return (self.n - self.samples_seen) // self.world_size

    def advance(self, per_rank: int) -> None:
        """Every rank consumed ``per_rank`` more samples of this epoch."""
        self.samples_seen += per_rank * self.world_size

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.samples_seen = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "samples_seen": self.samples_seen}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.samples_seen = int(state["epoch"]), int(state["samples_seen"])
