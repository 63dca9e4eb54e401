"""Which checkpoint folders are complete, and which is the newest: ``step_<N>``, ordered by ``N``.

A checkpoint of step ``N`` lives in ``step_<N>`` (zero-padded to 6 digits, and longer past
999,999). DCP writes the folder's ``.metadata`` last, so a folder without one is a save that
has not finished, or never will (the job was interrupted while writing it). Folders are
ordered by ``N`` as a number: sorted as strings, ``step_1000000`` would come before
``step_999999``, and a job would resume from the older one and delete the newer.

The folder may also be a URL, ``s3://bucket/job`` (object storage through fsspec, which DCP
writes to by itself: appendix 08a): :func:`location` makes it a path object with pathlib's API
(universal_pathlib's ``UPath``), so the same code lists, checks and deletes checkpoints in both;
a local folder stays a ``pathlib.Path``.

Taught in chapter 08 (section 4, asynchronous checkpoints; section 5, the production job).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

__all__ = ["step_of", "checkpoints", "latest_complete", "prunable", "is_url", "location", "remove"]


def is_url(folder) -> bool:
    """Whether ``folder`` is a URL (``s3://bucket/job``, ``memory://job``), not a local path."""
    return "://" in str(folder)


def location(folder):
    """``folder`` as a path object: a ``pathlib.Path`` for a local folder; for a URL, a ``UPath``
    (universal_pathlib: ``/``, ``.name``, ``.exists()``, ``.iterdir()``, ``.read_bytes()`` over
    fsspec; ``.fs`` and ``.path`` name its file system and its path there).

    A URL's file system keeps no cache of listings (``use_listings_cache=False``): fsspec's object
    stores (s3fs) keep the answer of every ``ls`` for the life of the file system object, which
    fsspec shares within a process. Another rank's writes (a ``.metadata`` that completes a
    checkpoint) and rank 0's deletions happen in other processes and never update it, so a cached
    listing would show a checkpoint as incomplete, or one as present that is gone, and a job
    could resume from an older checkpoint than the newest. Uncached, every listing asks the store."""
    if not is_url(folder):
        return Path(folder)
    from upath import UPath  # universal_pathlib: the course's kubernetes extra

    return UPath(str(folder), use_listings_cache=False)


def step_of(path) -> int | None:
    """The step of a checkpoint folder named ``step_<digits>``, or None for any other name."""
    name = PurePosixPath(str(path)).name  # a Path, a UPath or a URL string: its last part
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else None


def _step_folders(folder) -> list:
    """Every entry of ``folder`` named ``step_*`` (none when ``folder`` does not exist)."""
    if not is_url(folder):
        return list(Path(folder).glob("step_*"))
    try:
        return [p for p in location(folder).iterdir() if p.name.startswith("step_")]
    except (FileNotFoundError, NotADirectoryError):  # nothing written under that URL yet
        return []


def checkpoints(folder) -> tuple[list, list]:
    """``(complete, incomplete)`` ``step_<N>`` subfolders of ``folder`` (a local folder: ``Path``s;
    a URL: ``UPath``s), each in order of ``N`` (a number, not a string); complete ones have their
    ``.metadata``."""
    found = sorted((p for p in _step_folders(folder) if step_of(p) is not None), key=step_of)
    done = [(p / ".metadata").exists() for p in found]  # one look at each folder
    pairs = list(zip(found, done, strict=True))
    return [p for p, d in pairs if d], [p for p, d in pairs if not d]


def latest_complete(folder: str | os.PathLike) -> Path | None:
    """The ``step_*`` subfolder of ``folder`` with the highest step that has a ``.metadata``, or None."""
    done, _ = checkpoints(folder)
    return done[-1] if done else None


def prunable(folder, keep: int) -> list:
    """What to delete: all but the newest ``keep`` complete checkpoints, and every incomplete one
    older than the newest complete one (a save that was interrupted: it will never complete)."""
    done, unfinished = checkpoints(folder)
    newest = step_of(done[-1]) if done else -1
    return done[:-keep] + [p for p in unfinished if step_of(p) < newest]


def remove(path) -> None:
    """Delete the checkpoint folder ``path`` and all it holds, ignoring errors (it is tried again
    at the next prune): ``shutil.rmtree`` for a local one; for a URL, ``fs.rm(recursive=True)`` on
    its store, where a "folder" is the prefix its objects' names share."""
    if not is_url(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    where = location(path)
    try:
        where.fs.rm(where.path, recursive=True)
    except OSError:  # s3fs turns the store's errors into OSError (FileNotFoundError, PermissionError)
        pass
