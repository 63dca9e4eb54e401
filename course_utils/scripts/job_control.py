"""How the production job stops, where it resumes, and how it is killed on purpose.

* ``StopFlag``: set by SIGTERM or SIGINT (Ctrl-C; torchrun passes both on to its ranks), or when
  the rank's torchrun agent is gone (a SIGKILLed agent passes nothing on, and its orphaned ranks
  would train on); ``train_hybrid`` reads it once a step and the ranks agree on a last step;
* ``where_to_resume``: the newest complete checkpoint, rank 0 saying which newer ones it skips;
* ``wait_until_logged`` and ``kills_itself``: the demonstration kills of ``--kill-rank`` /
  ``--kill-what``, timed so that where the job resumes does not depend on the machine's speed.

Taught in chapter 08 (section 5, the production job).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from course_utils.scripts.job_events import hosts_rendezvous, read_log, torchrun_agent

__all__ = ["StopFlag", "wait_until_logged", "where_to_resume", "kills_itself"]


class StopFlag:
    """Set by SIGTERM or SIGINT, or when this rank's torchrun agent is gone (a SIGKILLed agent cannot
    pass a signal on, and its orphaned ranks would otherwise train on). The training loop reads it
    once a step. ``signal.signal`` needs the main thread."""

    def __init__(self):
        self.why: str | None = None
        self.parent = os.getppid()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.why = self.why or signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        if self.why is None and os.getppid() != self.parent:
            self.why = "its torchrun agent being gone"
        return self.why is not None


def wait_until_logged(out: Path, step: int, timeout: float = 60.0) -> None:
    """Block until rank 0 has logged the checkpoint of ``step`` complete (its ``checkpoint`` event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [e["step"] for e in read_log(out, 0) if e["event"] == "checkpoint"]
        if done and max(done) >= step:
            return
        time.sleep(0.02)
    raise TimeoutError(f"the checkpoint of step {step} was not complete in {out} after {timeout:g} s")


def where_to_resume(out: Path, rank: int) -> Path | None:
    """The newest complete checkpoint in ``out``; rank 0 says which, and which newer ones it skips."""
    from course_utils.checkpoint import checkpoints, step_of

    done, unfinished = checkpoints(out)
    resume_from = done[-1] if done else None
    if rank == 0:
        newest = -1 if resume_from is None else step_of(resume_from)
        newer = [p.name for p in unfinished if step_of(p) > newest]
        if newer:
            print(
                f"skipping incomplete checkpoint(s) {', '.join(newer)} (a save was interrupted); "
                "they are deleted once a newer checkpoint is complete",
                flush=True,
            )
    return resume_from


def kills_itself(args, rank: int) -> bool:
    """Whether this rank is the one ``--kill-rank`` / ``--kill-what`` names."""
    if args.kill_what == "rendezvous-host":
        return hosts_rendezvous(torchrun_agent())
    return rank == args.kill_rank
