"""Arrival times shared by the ranks of one wire group, through a file mapped in memory.

Every rank of a group writes, before it hands an operation to gloo, when it arrived (and the
model's seconds for its part) into its slot of that operation; a rank reads the others' slots
once gloo has completed the operation, by which time every rank has arrived and written. No
message and no CPU beyond a few stores: the ranks of a launch share one machine, its memory
and its monotonic clock (the wire is a single-machine teaching tool).

Layout, float64: collectives ``[SLOTS, size, 2]`` (arrival, model seconds), indexed by the
group's collective count modulo ``SLOTS``; messages ``[size, size, TAGS, COUNTS]`` (the time the
sender's link started it), indexed by (sender, receiver, tag modulo ``TAGS``, the number of
messages with that tag between the two, modulo ``COUNTS``). Messages of one tag between two
ranks are paired in the order they are posted, as gloo pairs them.

Taught in chapter 02 (how the wire knows when the last rank arrived).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from datetime import timedelta

import torch

__all__ = ["Stamps", "SLOTS", "TAGS", "COUNTS"]

SLOTS = 4096
TAGS, COUNTS = 1024, 8


def _shared_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Stamps:
    """The group's shared table of arrival times; rank 0 creates the file, the others map it."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        floats = SLOTS * size * 2 + size * size * TAGS * COUNTS
        nbytes = floats * 8
        if rank == 0:
            fd, path = tempfile.mkstemp(prefix="course_wire_", dir=_shared_dir())
            os.ftruncate(fd, nbytes)
            store.set("wire_stamps_path", path)
        else:
            store.wait(["wire_stamps_path"], timeout)
            path = store.get("wire_stamps_path").decode()
            fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        store.set(f"wire_stamps_mapped_{rank}", "1")
        if rank == 0:  # once every rank has mapped it, the name is no longer needed
            store.wait([f"wire_stamps_mapped_{r}" for r in range(size)], timeout)
            os.unlink(path)
        table = torch.frombuffer(self.map, dtype=torch.float64)
        self.collectives = table[: SLOTS * size * 2].view(SLOTS, size, 2)
        self.messages = table[SLOTS * size * 2 :].view(size, size, TAGS, COUNTS)

    def arrive(self, count: int, rank: int, arrival: float, seconds: float) -> None:
        """Rank ``rank`` arrived at collective number ``count`` at ``arrival``, its part ``seconds``."""
        self.collectives[count % SLOTS, rank, 0] = arrival
        self.collectives[count % SLOTS, rank, 1] = seconds

    def last_arrival(self, count: int) -> tuple[float, float]:
        """``(latest arrival, largest model seconds)`` over the ranks, for collective ``count``."""
        row = self.collectives[count % SLOTS]
        return row[:, 0].max().item(), row[:, 1].max().item()

    def message_started(self, src: int, dst: int, tag: int, count: int) -> float:
        """When the sender's link started message number ``count`` of ``tag`` from ``src`` to ``dst``."""
        return self.messages[src, dst, tag % TAGS, count % COUNTS].item()

    def start_message(self, src: int, dst: int, tag: int, count: int, start: float) -> None:
        self.messages[src, dst, tag % TAGS, count % COUNTS] = start
