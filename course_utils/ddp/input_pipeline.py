"""Feeding a GPU per rank: a DataLoader with workers and pinned memory, and copies that overlap.

One rank's loader, as PyTorch's performance guide writes it:

    loader = DataLoader(dataset, batch_size=b, sampler=DistributedSampler(dataset),
                        num_workers=4,             # batches made in 4 worker processes, not the trainer
                        pin_memory=True,           # each batch copied into page-locked memory
                        persistent_workers=True,   # workers kept from one epoch to the next
                        prefetch_factor=2)         # each worker keeps 2 batches ready ahead
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)

* ``num_workers``: the batches are made (read, decoded, collated) in worker processes while the
  rank trains; with 0 the training loop waits for each. The order does not change: batch ``i``
  comes from worker ``i % num_workers`` and the loader hands them out in order.
* ``pin_memory``: the GPU's copy engine reads page-locked (pinned) host memory directly; a
  pageable tensor is first staged through a pinned buffer by the driver. Only pinned memory lets
  ``to(device, non_blocking=True)`` return before the copy is done, so the copy overlaps the
  work already queued on the GPU. On a machine without a GPU it has nothing to pin for
  (``make_loader`` turns it off there, as it does ``non_blocking``, which a CPU copy ignores).
* ``persistent_workers``: without it every epoch starts ``num_workers`` new processes (each
  re-importing what the dataset needs); with it the same workers serve every epoch.
* ``prefetch_factor``: batches each worker prepares ahead (``num_workers x prefetch_factor`` in
  flight).

``worker_pids`` shows the last two on any machine: which processes made each epoch's batches.

Taught in chapter 04 (appendix 04b, section 2).
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

__all__ = ["make_loader", "to_device", "WhoMadeIt", "worker_pids"]


def make_loader(
    dataset,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 2,
    persistent_workers: bool = True,
    prefetch_factor: int = 2,
    seed: int = 0,
) -> DataLoader:
    """This rank's ``DataLoader``: ``DistributedSampler`` rows, ``num_workers`` workers, memory pinned
    when the batches are for a GPU (``device.type == "cuda"``)."""
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    workers = (
        {"persistent_workers": persistent_workers, "prefetch_factor": prefetch_factor} if num_workers else {}
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        **workers,
    )


def to_device(batch, device: torch.device) -> list[torch.Tensor]:
    """Every tensor of ``batch`` on ``device``; to a GPU without waiting (the batch is pinned)."""
    return [t.to(device, non_blocking=device.type == "cuda") for t in batch]


class WhoMadeIt(Dataset):
    """``n`` rows: row ``i`` is ``(i, pid of the process that made it)``, both int64 scalars."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor(i), torch.tensor(os.getpid() if get_worker_info() else 0)


def worker_pids(persistent_workers: bool, epochs: int = 2, n: int = 64, num_workers: int = 2) -> dict:
    """Run ``epochs`` epochs of ``make_loader(WhoMadeIt(n))`` (CPU, rank 0 of 2) and return
    ``{"rows": [row ids per epoch], "pids": [set of worker pids per epoch]}``."""
    loader = make_loader(
        WhoMadeIt(n),
        8,
        torch.device("cpu"),
        0,
        2,
        num_workers=num_workers,
        persistent_workers=persistent_workers,
    )
    rows, pids = [], []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        batches = list(loader)
        rows.append(torch.cat([i for i, _ in batches]).tolist())
        pids.append({int(p) for _, pid in batches for p in pid})
    return {"rows": rows, "pids": pids}
