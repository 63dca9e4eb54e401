"""Running learners' functions on real ranks, several in one launch, each in a fresh process group.

``run_candidates(body, candidates, world_size=...)`` starts ``world_size`` gloo ranks once
(``launch``, one thread per rank) and, for each candidate function in turn, starts a new default
process group (``init_process_group`` over a prefix of one store, with a short timeout), runs
``body(fn)`` on every rank, and ends the group. A candidate that leaves a rank waiting for a
message that never comes costs ``wait_s`` seconds and is reported, instead of hanging the launch;
the next candidate starts clean. Each rank's outcome comes back as an ``Outcome``.

Taught in chapters 02, 04, 05 and 07 (their "build it" exercises run the learner's code this way).
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import NamedTuple

__all__ = ["Outcome", "run_candidates", "first_error"]


class Outcome(NamedTuple):
    """One rank's run of one candidate: ``data`` (what ``body`` returned), or ``error`` (the
    exception, one line) and ``timed_out`` (the rank waited ``wait_s`` for a message)."""

    rank: int
    data: object = None
    error: str | None = None
    timed_out: bool = False


def _short(exc: BaseException) -> str:
    """The exception in one line, with the last place in the learner's code (not torch's) it passed."""
    text = " ".join(str(exc).split())
    torch_dir = os.path.dirname(os.path.dirname(dist_file()))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)]
    line = frames[-1] if frames else None
    where = f" (in {line.name}, line {line.lineno})" if line is not None else ""
    return f"{type(exc).__name__}: {text[:240]}{where}"


def dist_file() -> str:
    import torch.distributed as dist

    return dist.__file__


def _timed_out(exc: BaseException) -> bool:
    return "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower()


def _rank_main(body, candidates, wait_s: float) -> list[Outcome]:
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=60),
    )
    outcomes = []
    for i, fn in enumerate(candidates):
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"exercise/{i}", store),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=wait_s),
        )
        try:
            outcomes.append(Outcome(rank, data=body(fn)))
        except Exception as exc:
            outcomes.append(Outcome(rank, error=_short(exc), timed_out=_timed_out(exc)))
        # every rank is done with this candidate (or has given up waiting) before its group ends
        store.set(f"exercise/{i}/done/{rank}", "1")
        try:
            store.wait([f"exercise/{i}/done/{r}" for r in range(world)], timedelta(seconds=wait_s + 5))
        except Exception:
            pass
        dist.destroy_process_group()
    return outcomes


def run_candidates(body, candidates: list, *, world_size: int, wait_s: float = 5.0) -> list[list[Outcome]]:
    """``body(fn)`` for each of ``candidates`` on ``world_size`` gloo ranks, in one launch;
    returns, per candidate, its ``world_size`` outcomes in rank order."""
    from course_utils.runtime.launcher import launch

    per_rank = launch(
        _rank_main,
        body,
        list(candidates),
        wait_s,
        world_size=world_size,
        backend="gloo",
        init_group=False,
        threads_per_rank=1,
        timeout=60 + len(candidates) * 3 * (wait_s + 5),
    )
    return [[per_rank[r][i] for r in range(world_size)] for i in range(len(candidates))]


def first_error(outcomes: list[Outcome], what: str) -> str | None:
    """A sentence for the first rank that raised or waited in vain, or None if none did."""
    timed = [o for o in outcomes if o.timed_out]
    raised = [o for o in outcomes if o.error is not None and not o.timed_out]
    if raised:
        o = raised[0]
        return f"rank {o.rank} raised {o.error} while running {what}"
    if timed:
        ranks = ", ".join(str(o.rank) for o in timed)
        return (
            f"rank(s) {ranks} waited more than the time allowed for a message that never came, running "
            f"{what}: a send without the matching receive on the other rank (or a receive from the "
            "wrong rank), so both wait for ever. Check that every rank's send to its neighbour "
            "pairs with that neighbour's receive from it, at the same step"
        )
    return None
