"""How the production job stops and where it resumes.

* ``StopFlag``: set by SIGTERM or SIGINT (Ctrl-C; torchrun passes both on to its ranks), or when
  the rank's torchrun agent is gone (a SIGKILLed agent passes nothing on, and its orphaned ranks
  would train on); ``train_hybrid`` reads it once a step and the ranks agree on a last step;
* ``where_to_resume``: the newest complete checkpoint, rank 0 saying which newer ones it skips.

The demonstration kills of ``--kill-rank`` / ``--kill-what`` are in ``faults``.

Taught in chapter 08 (section 5, the production job).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["StopFlag", "where_to_resume"]


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


def where_to_resume(out: Path | str, rank: int) -> Path | None:
    """The newest complete checkpoint in ``out`` (a local folder: a ``Path``; a URL,
    ``--checkpoint-url``: a ``UPath``); rank 0 says which, and which newer ones it skips."""
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
