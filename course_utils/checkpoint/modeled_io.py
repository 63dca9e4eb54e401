"""Checkpoint time on a modeled cluster: the real DCP saves, timed as the storage they write to.

In a rank of a modeled cluster (``launch(fn, cluster=...)``) the training steps run in virtual
time, but a save's cost is not in its operators: it is the time the bytes take to reach the
storage. ``ModeledCheckpointer`` wraps a :class:`~course_utils.checkpoint.Checkpointer`: the real
``dcp.save`` or ``dcp.async_save`` still runs (real files, a real resume), on a thread of its
own so that none of its work is charged to the rank, and the rank's clock is moved by a model
of the storage instead:

* **blocking** (``dcp.save``): the rank stands still while its share of the checkpoint is
  written, ``bytes / write bandwidth`` (``cluster.spend``, a span named ``checkpoint write``);
* **async** (``dcp.async_save``): the rank stands still only while the state is copied to host
  memory, ``bytes / staging bandwidth`` (``checkpoint staging``); the write runs beside the
  training on a lane of its own (``cluster.in_background(..., lane="storage")``), and the next
  save first waits for it.

A rank's share: the checkpoint's tensor bytes (model and optimizer state, ``state_bytes``) over
the number of ranks, DCP spreading the replicated tensors over them.

``STORAGE`` holds the storage presets, bandwidths per GPU with their sources;
``STAGING_BPS`` the device-to-host copy.

Taught in chapter 08 (section 4, checkpointing while training goes on).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_utils.runtime import cluster

__all__ = ["Storage", "STORAGE", "STAGING_BPS", "state_bytes", "ModeledCheckpointer"]


@dataclass(frozen=True)
class Storage:
    """Where checkpoints go: ``write_Bps`` bytes per second per GPU, with its ``source``."""

    name: str
    write_Bps: float
    source: str

    def describe(self) -> str:
        return f"{self.name}: {self.write_Bps / 1e9:.3g} GB/s of writes per GPU"


STORAGE = {
    "parallel-fs": Storage(
        "a parallel file system over the node's storage network",
        12.5e9,
        "DGX H100 (the MLPerf system description of appendix 07f's 8xH100 node): two 400 Gb/s "
        "ConnectX-7 ports for storage, 100 GB/s per node, 12.5 GB/s per GPU: the network's limit, "
        "the most a shared file system can take from each GPU",
    ),
}

#: Device-to-host copy of the state (staging): PCIe Gen5 x16, 64 GB/s one way (H100 datasheet;
#: the ``pcie`` network preset).
STAGING_BPS = 64e9


def state_bytes(state) -> int:
    """Bytes of the tensors in ``state`` (a ``Stateful`` object or a nested dict of tensors)."""
    tree = state.state_dict() if hasattr(state, "state_dict") else state
    stack, total = [tree], 0
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def _uncharged(fn, *args):
    """``fn(*args)`` on a thread of its own: real work the rank's modeled clock does not see."""
    out, error = [], []

    def run():
        try:
            out.append(fn(*args))
        except BaseException as exc:  # raised again in the rank's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="checkpoint-io")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return out[0]


class ModeledCheckpointer:
    """A ``Checkpointer`` whose saves take the modeled storage's time (module docstring).

    ``storage``: a ``Storage`` or a ``STORAGE`` key. ``stalls`` and ``waited`` (modeled seconds,
    one per save) are what the real ``Checkpointer`` records in wall-clock seconds.
    """

    def __init__(self, checkpointer, storage="parallel-fs"):
        if cluster.installed() is None:
            raise RuntimeError(
                "ModeledCheckpointer times saves on a modeled cluster: launch(fn, cluster=...)"
            )
        self.real, self.mode = checkpointer, checkpointer.mode
        self.storage = STORAGE[storage] if isinstance(storage, str) else storage
        self.waited: list[float] = []
        self.writing = None  # the write in the background (async), a cluster.in_background handle

    def save(self, state, step: int) -> float:
        """Checkpoint ``state`` as of ``step`` (the real save), and charge its modeled time;
        returns the modeled seconds the save held the rank up (after any wait, in ``waited``)."""
        start = cluster.modeled_ns()
        self._join_write()
        self.waited.append((cluster.modeled_ns() - start) / 1e9)
        share = _uncharged(state_bytes, state) / dist.get_world_size()
        _uncharged(self.real.save, state, step)
        held = share / (self.storage.write_Bps if self.mode == "blocking" else STAGING_BPS)
        cluster.spend(held, "checkpoint write" if self.mode == "blocking" else "checkpoint staging")
        if self.mode == "async":
            self.writing = cluster.in_background(share / self.storage.write_Bps, "checkpoint write")
        return round(held, 9)

    def _join_write(self) -> None:
        if self.writing is not None:
            self.writing.wait()
            self.writing = None

    def wait(self) -> None:
        """The save in the background, complete: modeled, then real."""
        self._join_write()
        _uncharged(self.real.wait)

    def close(self) -> None:
        self._join_write()
        _uncharged(self.real.close)
