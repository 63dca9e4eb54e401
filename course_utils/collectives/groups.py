"""Starting a process group, with the errors a learner meets turned into clear messages.

``dist.init_process_group`` needs four things: a backend, an *init method* (how
the ranks find each other: ``env://``, ``tcp://host:port`` or ``file://path``),
this process's rank and the world size. When something is missing it fails
with messages like "Wait timeout" or "code: -98, name: EADDRINUSE". ``init_group``
calls it the same way and re-raises those failures as ``GroupInitError``, whose
message says what went wrong and how to fix it.

Taught in chapter 02 (section 2, the life cycle of a process group; chapter 02a, section 5, errors).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from datetime import timedelta

import torch.distributed as dist

from course_utils.runtime.hardware import group_backend, pick_backend

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class GroupInitError(RuntimeError):
    """``init_group`` failed; ``reason`` is one of "environment", "port in use", "ranks missing"."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


def _address(init_method: str) -> str:
    """``host:port`` the ranks meet at, as far as the init method says."""
    if init_method.startswith("tcp://"):
        return init_method[len("tcp://") :]
    if init_method.startswith("env://"):
        return f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    return init_method


@contextlib.contextmanager
def _quiet_stdout_fd():
    """File descriptor 1 sent to /dev/null for a moment: torch 2.9's gloo prints "[Gloo] Rank 0
    is connected to 1 peer ranks ..." from C++ while the group starts, and ranks that share a
    terminal interleave those lines with each other and with the program's own output."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def init_group(
    backend: str = "gloo",
    init_method: str = "env://",
    rank: int | None = None,
    world_size: int | None = None,
    timeout: float = 60.0,
) -> None:
    """``dist.init_process_group`` with clear errors; same arguments (``timeout`` in seconds).

    Raises ``GroupInitError`` when the environment torchrun would set is missing
    (``env://`` without RANK etc.), when the rendezvous port is taken, or when
    not every rank joined within ``timeout``; ``ValueError`` (from
    ``pick_backend``) when the backend cannot serve this many ranks per machine.
    ``"nccl"`` starts the group as ``"cpu:gloo,cuda:nccl"`` (``hardware.group_backend``),
    so that the ranks can exchange CPU tensors too.
    """
    if init_method.startswith("env://"):
        missing = [
            name
            for name in TORCHRUN_ENV
            if name not in os.environ
            and not (name == "RANK" and rank is not None)
            and not (name == "WORLD_SIZE" and world_size is not None)
        ]
        if missing:
            raise GroupInitError(
                "environment",
                (
                    f"init_method='env://' reads {', '.join(missing)} from the environment, and "
                    f"{'it is' if len(missing) == 1 else 'they are'} not set. Start the script with "
                    "torchrun (or course_utils.launch), which sets them for every rank, or pass "
                    "init_method='tcp://HOST:PORT' with rank= and world_size="
                ),
            )
    expected = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    # Ranks on this machine share its GPUs: the backend must serve that many.
    pick_backend(int(os.environ.get("LOCAL_WORLD_SIZE", expected)), backend)
    try:
        with _quiet_stdout_fd():
            dist.init_process_group(
                group_backend(backend),
                init_method=init_method,
                timeout=timedelta(seconds=timeout),
                rank=-1 if rank is None else rank,
                world_size=-1 if world_size is None else world_size,
            )
    except (RuntimeError, ValueError) as exc:
        explained = _explain(exc, init_method, expected, timeout)
        if explained is exc:
            raise
        raise explained from exc


def _explain(exc: Exception, init_method: str, world_size: int, timeout: float) -> Exception:
    """A GroupInitError for the failures we recognise; ``exc`` itself for any other."""
    text, where = str(exc), _address(init_method)
    if "EADDRINUSE" in text or "ddress already in use" in text:
        return GroupInitError(
            "port in use",
            (
                f"the rendezvous address {where} is already in use by another process (a previous run "
                "still alive, or another program). Stop that process, or choose another port: a free "
                "one from course_utils.collectives.free_port(), or with torchrun --standalone / "
                "--rdzv-endpoint HOST:0 let torchrun pick one"
            ),
        )
    if "trying to connect" in text:
        return GroupInitError(
            "ranks missing",
            (
                f"nobody answered at {where} within {timeout:g} s. Rank 0 hosts the rendezvous there: "
                "check that rank 0 was started and uses the same address, and pass a larger timeout "
                "if it is only slow to start"
            ),
        )
    if "imed out" in text or "Wait timeout" in text:
        joined = re.search(r"(\d+)/(\d+) clients joined", text)
        count = f"only {joined[1]} of {joined[2]}" if joined else f"not all {world_size}"
        return GroupInitError(
            "ranks missing",
            (
                f"{count} ranks joined the group at {where} within {timeout:g} s. Every one of the "
                f"{world_size} processes must call init_process_group with the same init method and "
                "world size: check that all were started (a crashed or forgotten rank never joins), "
                "that they use the same address, and pass a larger timeout if they are only slow"
            ),
        )
    return exc
