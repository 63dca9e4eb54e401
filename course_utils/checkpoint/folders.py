"""Which checkpoint folders are complete, and which is the newest: ``step_<N>``, ordered by ``N``.

A checkpoint of step ``N`` lives in ``step_<N>`` (zero-padded to 6 digits, and longer past
999,999). DCP writes the folder's ``.metadata`` last, so a folder without one is a save that
has not finished, or never will (the job was interrupted while writing it). Folders are
ordered by ``N`` as a number: sorted as strings, ``step_1000000`` would come before
``step_999999``, and a job would resume from the older one and delete the newer.

Taught in chapter 08 (section 4, asynchronous checkpoints; section 5, the production job).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["step_of", "checkpoints", "latest_complete", "prunable"]


def step_of(path: str | os.PathLike) -> int | None:
    """The step of a checkpoint folder named ``step_<digits>``, or None for any other name."""
    name = Path(path).name
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else None


def checkpoints(folder: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """``(complete, incomplete)`` ``step_<N>`` subfolders of ``folder``, each in order of ``N``
    (a number, not a string); complete ones have their ``.metadata``."""
    found = sorted((p for p in Path(folder).glob("step_*") if step_of(p) is not None), key=step_of)
    return [p for p in found if (p / ".metadata").exists()], [
        p for p in found if not (p / ".metadata").exists()
    ]


def latest_complete(folder: str | os.PathLike) -> Path | None:
    """The ``step_*`` subfolder of ``folder`` with the highest step that has a ``.metadata``, or None."""
    done, _ = checkpoints(folder)
    return done[-1] if done else None


def prunable(folder: str | os.PathLike, keep: int) -> list[Path]:
    """What to delete: all but the newest ``keep`` complete checkpoints, and every incomplete one
    older than the newest complete one (a save that was interrupted: it will never complete)."""
    done, unfinished = checkpoints(folder)
    newest = step_of(done[-1]) if done else -1
    return done[:-keep] + [p for p in unfinished if step_of(p) < newest]
