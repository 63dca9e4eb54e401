"""What the production job checks before it trains: each problem in one line, with its fix.

Bad input to a torchrun job used to end in one traceback per rank plus torchrun's failure block.
``train_hybrid`` checks its arguments, its launcher, its data and its checkpoint folder (or
``--checkpoint-url``: a scheme fsspec knows, a bucket that exists) first and raises
``JobInputError``: one line naming what is wrong and how to fix it. Every rank runs
the same checks on the same arguments and files, so every rank reaches the same verdict with no
collective; rank 0 alone prints it (``report_and_exit``), every rank exits with code 2, and
torchrun's summary names the error (the script's ``main`` is wrapped in torch's ``@record``).
The other ranks leave after rank 0: torchrun stops every rank once one has ended with an error,
and a rank 0 still starting up would be stopped before it said anything.

Taught in chapter 08 (section 5, the production job).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

__all__ = [
    "JobInputError",
    "OneLineParser",
    "world_size_from_launcher",
    "check_cluster_env",
    "check_batch",
    "check_parquet",
    "check_data",
    "check_checkpoint_dir",
    "check_checkpoint_url",
    "checkpoint_flag",
    "check_checkpoint_matches",
    "report_and_exit",
    "EXIT_CODE",
    "WAIT_FOR_RANK_0_S",
]

EXIT_CODE = 2  # what argparse and shells use for a command used wrongly
WAIT_FOR_RANK_0_S = 60.0  # the longest another rank waits for rank 0 to say it and end
TABLE = "model/embeddings.table"  # a checkpoint's entry for table t: TABLE + str(t)
TORCHRUN = "torchrun --standalone --nproc-per-node 2 -m course_utils.scripts.train_hybrid"


class JobInputError(ValueError):
    """Bad input to the job: the message is one line, the problem and its fix."""


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose errors are a ``JobInputError`` (one line, printed once by ``report``)
    instead of a usage block printed by every rank."""

    def error(self, message: str):
        raise JobInputError(f"{message} (see --help)")


def world_size_from_launcher(environ=os.environ) -> int:
    """The world size torchrun gave this rank; ``JobInputError`` when no launcher started it."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in environ]
    if missing:
        raise JobInputError(
            f"this is a torchrun script and {', '.join(missing)} are not set: start it with {TORCHRUN} ..."
        )
    return int(environ["WORLD_SIZE"])


def check_cluster_env(environ=os.environ) -> None:
    """``COURSE_CLUSTER``, when set, names a modeled cluster (``h100:nvlink``: the job then runs
    in its virtual time, ``course_utils.runtime.cluster``); a bad value is named, with the presets."""
    from course_utils.runtime.cluster.spec import ENV, Cluster

    if environ.get(ENV):
        try:
            Cluster.from_env(environ[ENV])
        except ValueError as exc:
            raise JobInputError(str(exc)) from None


def check_batch(args, world: int) -> None:
    """The global batch splits equally over the ranks; a killed rank exists."""
    if args.batch_size % world:
        fit = max(world, args.batch_size // world * world)
        raise JobInputError(
            f"--batch-size {args.batch_size} (rows per step over all ranks) cannot be split equally over "
            f"{world} ranks; use a multiple of {world}, such as {fit}"
        )
    if args.kill_rank >= world:
        raise JobInputError(f"--kill-rank {args.kill_rank} is not a rank of this job (0 to {world - 1})")


def check_parquet(path: Path, flag: str) -> dict:
    """``parquet_info`` of a file the job was given with ``flag``, or a one-line ``JobInputError``.
    What the file is instead (missing, a folder, empty, Criteo's text with the ``from-criteo``
    command that converts it, ...) is the data layer's to say (``data.check_parquet_file``)."""
    from course_utils.workload import data

    try:
        data.check_parquet_file(path)
    except (FileNotFoundError, ValueError) as exc:
        raise JobInputError(f"{flag}: {exc}") from None
    info = data.parquet_info(path)
    if info["cardinalities"] is None:
        raise JobInputError(
            f"{flag}: {path.name} has no table sizes in its metadata; "
            "write it with write_parquet or from-criteo"
        )
    return info


def _row_groups_fit(info: dict, path: Path, flag: str, world: int) -> None:
    groups = info["row_groups"]
    if groups % world:
        fixed = -(-groups // world) * world
        out = path.with_name(f"{path.stem}_{fixed}rg{path.suffix}")
        raise JobInputError(
            f"{flag} {path} has {groups} row group{'s' * (groups != 1)}, not a multiple of the {world} ranks "
            "(each reads whole row groups); repartition it: "
            f"python -m course_utils.workload.data repartition {path} {out} {fixed}"
        )


def check_data(args, world: int) -> tuple[dict, dict] | None:
    """``--data`` and ``--test-data``: parquet files written by ``write_parquet``, row groups that
    the ranks share equally, tables of the same sizes in both, and a batch that every rank can
    fill from its share. Returns their ``parquet_info``, or None for the job's own synthetic data."""
    from course_utils.workload import data

    if args.data is None:
        return None
    train = check_parquet(args.data, "--data")
    test = check_parquet(args.test_data, "--test-data")
    _row_groups_fit(train, args.data, "--data", world)
    _row_groups_fit(test, args.test_data, "--test-data", world)
    try:
        data.check_same_tables(args.data, args.test_data)
    except ValueError as exc:
        raise JobInputError(f"--data and --test-data: {exc}") from None
    per_rank = args.batch_size // world
    rows = [sum(train["rows_per_group"][r::world]) for r in range(world)]
    if min(rows) < per_rank:
        raise JobInputError(
            f"--batch-size {args.batch_size} needs {per_rank} rows per rank per step, and a rank's share "
            f"of --data {args.data} holds {min(rows)}; use --batch-size {min(rows) * world} or less, "
            "or more data"
        )
    return train, test


def check_checkpoint_dir(folder: Path) -> None:
    """``--checkpoint-dir`` is a folder this process can write, or can be made one."""
    if folder.exists() and not folder.is_dir():
        raise JobInputError(
            f"--checkpoint-dir {folder} is a file, not a folder; pass a folder (new or earlier)"
        )
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise JobInputError(f"--checkpoint-dir {folder}: {existing} is a file, not a folder; pass a folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise JobInputError(
            f"--checkpoint-dir {folder}: {existing} cannot be written by this user; pass another"
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def check_checkpoint_url(url: str | None) -> None:
    """``--checkpoint-url``, when given, is a URL that fsspec can reach: a scheme it knows, with its
    package installed (s3fs for ``s3://``), and on a store of buckets (S3, GCS, Azure) a bucket that
    exists and these credentials can see (the job creates none)."""
    if url is None:
        return
    from course_utils.checkpoint.folders import is_url

    if not is_url(url):
        raise JobInputError(
            f"--checkpoint-url {url} is not a URL; pass one such as s3://bucket/job "
            "(or leave it out: the checkpoints then go to --checkpoint-dir)"
        )
    try:
        import fsspec
        import upath  # noqa: F401  (universal_pathlib: how the job lists the checkpoints there)

        fs, root = fsspec.url_to_fs(url)
    except ImportError as exc:
        raise JobInputError(
            f"--checkpoint-url {url}: {_one_line(exc)}; install the course's kubernetes extra "
            "(pip install -r requirements.txt)"
        ) from None
    except ValueError as exc:  # fsspec: "Protocol not known: nosuch"
        raise JobInputError(
            f"--checkpoint-url {url}: {_one_line(exc)}; pass a URL fsspec knows, such as s3://bucket/job"
        ) from None
    bucket = fs.split_path(root)[0] if hasattr(fs, "split_path") else None  # object stores only
    try:
        exists = bucket is None or fs.exists(bucket)
    except Exception as exc:  # the store's own errors: no credentials, no connection, ...
        raise JobInputError(f"--checkpoint-url {url}: {type(exc).__name__}: {_one_line(exc)}") from None
    if not exists:
        raise JobInputError(
            f"--checkpoint-url {url}: the bucket {bucket!r} does not exist or these credentials cannot "
            "see it; create it first, or pass another URL"
        )


def checkpoint_flag(folder) -> str:
    """The option that named ``folder``: ``--checkpoint-url`` for a URL, ``--checkpoint-dir`` else."""
    from course_utils.checkpoint.folders import is_url

    return "--checkpoint-url" if is_url(folder) else "--checkpoint-dir"


def check_checkpoint_matches(folder: Path, cardinalities, embedding_dim: int) -> None:
    """The newest complete checkpoint in ``folder`` (a local folder or a URL; if any) is safe to
    load (no pickled values, no foreign ``.metadata``) and has this job's tables."""
    from course_utils.checkpoint import job, latest_complete, safe_load

    newest = latest_complete(folder)
    if newest is None:
        return
    flag = checkpoint_flag(folder)
    try:
        job.refuse_pickles(newest)
        saved = safe_load.read_metadata(newest).state_dict_metadata
    except safe_load.CheckpointRefused as exc:
        raise JobInputError(f"{flag}: {exc}") from None
    tables = {
        int(k[len(TABLE) :]): int(m.size[0])
        for k, m in saved.items()
        if k.startswith(TABLE) and k[len(TABLE) :].isdigit()
    }
    dims = {int(m.size[1]) for k, m in saved.items() if k.startswith(TABLE) and len(m.size) == 2}
    first = _first_difference([tables.get(t) for t in range(max(tables, default=-1) + 1)], cardinalities)
    if first is not None or dims - {embedding_dim}:
        table, there, here = first or (0, f"width {sorted(dims)[0]}", f"width {embedding_dim}")
        raise JobInputError(
            f"{flag} {folder} holds checkpoints of another job ({newest.name}: table {table} "
            f"{there}; this job's data: {here}); pass a new {flag}, or the data it was trained on"
        )


def _first_difference(a, b) -> tuple[int, str, str] | None:
    """``(table, "<rows> rows" in a, ... in b)`` for the first table whose sizes differ, or None."""
    for table in range(max(len(a), len(b))):
        x, y = (
            f"{c[table]} rows" if table < len(c) and c[table] is not None else "no such table" for c in (a, b)
        )
        if x != y:
            return table, x, y
    return None


def report_and_exit(error: Exception, rank: int, stop) -> NoReturn:
    """Rank 0 prints the one line; every rank records it in torchrun's error file (``@record``'s
    error handler, so that torchrun's summary names it) and exits with code 2.

    The other ranks first wait for rank 0 to end: until torchrun stops them (``stop``, the job's
    ``StopFlag``, set by its SIGTERM) or ``WAIT_FOR_RANK_0_S`` have passed. A rank that ended at
    once would make torchrun stop all the others, and a rank 0 still importing on a busy machine
    would be stopped before it had said anything."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    if rank == 0:
        print(f"train_hybrid: {error}", file=sys.stderr, flush=True)
    get_error_handler().record_exception(error)
    deadline = time.monotonic() + WAIT_FOR_RANK_0_S
    while rank != 0 and not stop.requested and time.monotonic() < deadline:
        time.sleep(0.05)
    raise SystemExit(EXIT_CODE)
