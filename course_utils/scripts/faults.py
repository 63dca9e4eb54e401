"""Faults injected on purpose: the demonstration kills of ``train_hybrid``'s ``--kill-*`` flags.

* ``FaultInjector``: asked once a step by the training loop (``before_step``); on the first attempt
  only, the rank that ``--kill-rank`` / ``--kill-what`` names kills itself with SIGKILL just before
  ``--kill-at-step``, once the checkpoints started before that step are complete on disk (so where
  the job resumes from does not depend on the machine's speed); ``--kill-what node`` kills its
  torchrun agent first;
* ``kills_itself``: whether this rank is the one the flags name;
* ``wait_until_logged``: block until rank 0 has logged a checkpoint complete.

Taught in chapter 08 (section 5, the production job).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from course_utils.scripts.job_events import hosts_rendezvous, log_event, read_log, torchrun_agent

__all__ = ["FaultInjector", "kills_itself", "wait_until_logged"]


def wait_until_logged(out: Path, step: int, timeout: float = 60.0) -> None:
    """Block until rank 0 has logged the checkpoint of ``step`` complete (its ``checkpoint`` event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [e["step"] for e in read_log(out, 0) if e["event"] == "checkpoint"]
        if done and max(done) >= step:
            return
        time.sleep(0.02)
    raise TimeoutError(f"the checkpoint of step {step} was not complete in {out} after {timeout:g} s")


def kills_itself(args, rank: int) -> bool:
    """Whether this rank is the one ``--kill-rank`` / ``--kill-what`` names."""
    if args.kill_what == "rendezvous-host":
        return hosts_rendezvous(torchrun_agent())
    return rank == args.kill_rank


class FaultInjector:
    """The kill that ``args`` (``kill_rank``, ``kill_at_step``, ``kill_what``, ``checkpoint_every``)
    asks for, in the rank ``rank`` of the job writing to ``out``, on its attempt ``attempt`` (only
    the first one kills), which starts training after step ``first_step`` (0, or the step it
    resumed at). The loop saves every ``checkpoint_every`` steps, so the last checkpoint this attempt
    started before step ``kill_at_step`` is the last multiple of it after ``first_step``."""

    def __init__(self, args, out: Path, rank: int, attempt: int, first_step: int):
        self.args, self.out, self.rank, self.attempt = args, out, rank, attempt
        every = args.checkpoint_every
        last_save = (args.kill_at_step - 1) // every * every
        self.last_save = last_save if last_save > first_step else None

    def before_step(self, step: int) -> None:
        """Called just before the loop trains ``step`` (counted from 1): returns, or never returns."""
        args = self.args
        if self.attempt != 0 or step != args.kill_at_step or not kills_itself(args, self.rank):
            return
        if self.last_save is not None:
            wait_until_logged(self.out, self.last_save)
        log_event(
            self.out, attempt=self.attempt, rank=self.rank, event="killed", step=step, what=args.kill_what
        )
        if args.kill_what != "rank":
            os.kill(torchrun_agent(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
