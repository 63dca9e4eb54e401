"""What a training job's ranks write down as they go, so that a test or a notebook can tell what happened.

Each rank appends one JSON line per event (``started``, ``resumed``, ``step``, ``checkpoint``,
``killed``, ``stopped``, ``finished``) to ``DIR/events-rank<R>.jsonl``, opening and closing
the file each time, so a rank killed with SIGKILL loses nothing it wrote.
``course_utils.runtime.elastic_run`` reads the logs back (``read_events``, ``timeline``).

Taught in chapter 08 (sections 5 to 7: the jobs' event logs, read back as timelines).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["log_event", "read_log", "attempt_number", "torchrun_agent", "hosts_rendezvous"]


def log_event(out: Path, **event) -> None:
    """Append one event to this rank's log (opened and closed each time: a SIGKILL loses nothing)."""
    event["time"] = time.time()
    with open(out / f"events-rank{event['rank']}.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def read_log(out: Path, rank: int) -> list[dict]:
    """Rank ``rank``'s events so far (a line still being written is left out)."""
    path = out / f"events-rank{rank}.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return events


def attempt_number(out: Path, rank: int) -> int:
    """How many times this rank has been started before: the "started"/"resumed" events in its log."""
    path = out / f"events-rank{rank}.jsonl"
    if not path.exists():
        return 0
    return sum(
        json.loads(line)["event"] in ("started", "resumed") for line in path.read_text().splitlines() if line
    )


def torchrun_agent() -> int:
    """The process id of the torchrun agent that started this rank (its parent)."""
    parent = os.getppid()
    try:
        argv = Path(f"/proc/{parent}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        argv = []
    command = " ".join(argv)
    # the agent is `torchrun ...` or `python -m torch.distributed.run ...` (not, say, a test
    # runner whose arguments name a file test_torchrun.py)
    if not any(Path(a).name == "torchrun" or a == "torch.distributed.run" for a in argv[:3]):
        raise RuntimeError(
            "--kill-what node kills the torchrun agent that started this rank, but the parent "
            f"process {parent} is not torchrun ({command[:80]!r}); run the script under torchrun "
            "(Linux) or use --kill-what rank"
        )
    return parent


def hosts_rendezvous(agent: int) -> bool:
    """Whether the torchrun agent ``agent`` hosts the job's c10d rendezvous store: it listens on the
    port of its ``--rdzv-endpoint`` (read from its command line; Linux's ``/proc``). Of the stand-in
    nodes on one machine, whichever agent bound the port first hosts it."""
    argv = Path(f"/proc/{agent}/cmdline").read_bytes().decode().split("\0")
    endpoint = next(
        (
            argv[i + 1] if a in ("--rdzv-endpoint", "--rdzv_endpoint") else a.split("=", 1)[1]
            for i, a in enumerate(argv)
            if a in ("--rdzv-endpoint", "--rdzv_endpoint")
            or a.startswith(("--rdzv-endpoint=", "--rdzv_endpoint="))
        ),
        None,
    )
    if endpoint is None or "--standalone" in argv:
        return True  # one node: its agent hosts the store
    port = int(endpoint.rsplit(":", 1)[1])
    sockets = set()
    for fd in Path(f"/proc/{agent}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()  # local address, state (0A: LISTEN), inode
            if fields[3] == "0A" and fields[9] in sockets and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False
