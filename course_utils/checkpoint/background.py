"""Checkpoints written while training goes on: ``dcp.async_save`` against the blocking ``dcp.save``.

``dcp.save`` returns when every rank's file is on disk: the training loop stands still
for the whole write. ``dcp.async_save`` first copies the state into CPU memory (staging:
the checkpoint is of the step it was called at, even if training then changes the
weights), starts the write in a background thread and returns a ``Future``; the loop
goes on at once. Two rules come with it: wait for the previous save (``future.result()``)
before starting the next one, and give the background thread a process group of its own
with a CPU backend (``dist.new_group(backend="gloo")``), since its planning collectives run
while the training's collectives run on the default group (``async_save`` refuses a group
without a CPU backend: "A CPU backend must be enabled for async save").

Each checkpoint goes into a folder of its own, ``step_000015``; DCP writes the folder's
``.metadata`` last (under a temporary name, then renamed), so a folder without it is an
incomplete save and :func:`latest_complete` skips it. Folders are ordered by their step as a
number (``step_1000000`` is newer than ``step_999999``, which a string sort gets wrong). Only
the last ``keep`` complete folders are kept, and an incomplete one (a save that was interrupted)
is deleted once a newer one is complete.

:func:`train_big_table` is the run the chapter measures: data-parallel training of a model
whose state (a 200,000 x 64 embedding table and its Adagrad sums) is over 100 MB,
checkpointed with an :class:`~course_utils.checkpoint.AppState` every few steps. The model and
its sparse gradient's average come from appendix 04a (``course_utils.ddp.sparse_tables``).

Taught in chapter 08 (section 4, asynchronous checkpoints).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from course_utils.checkpoint.app_state import AppState
from course_utils.checkpoint.folders import latest_complete, location, prunable, remove
from course_utils.checkpoint.position import GlobalPositionSampler
from course_utils.ddp.sparse_tables import BigTableModel, average_sparse_gradient
from course_utils.runtime import compat, versions
from course_utils.runtime.hardware import rank_device

__all__ = [
    "Checkpointer",
    "latest_complete",
    "folder_bytes",
    "slowest_rank_stalls",
    "train_big_table",
]


def folder_bytes(folder: str | os.PathLike) -> int:
    """Bytes of all the files in ``folder``."""
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


class Checkpointer:
    """Save ``state`` into ``folder/step_<step>``, blocking (``dcp.save``) or in the
    background (``dcp.async_save``). Every rank calls :meth:`save` at the same steps.
    ``state``: a ``Stateful`` object such as an :class:`AppState` (saved as ``{"app": state}``),
    or a flat dict of tensors and values (saved as it is: ``checkpoint.job.job_state``).

    ``group``: the process group for DCP's collectives (a gloo group of its own).
    ``keep``: complete checkpoints kept on disk (rank 0 deletes the older ones).
    ``folder`` may be a URL (``s3://bucket/job``): DCP then writes through fsspec, and the old
    checkpoints are deleted there (``folders.location``, ``folders.remove``).
    """

    def __init__(self, folder: str | os.PathLike, mode: str, group=None, keep: int = 2):
        if mode not in ("blocking", "async"):
            raise ValueError(f"mode must be 'blocking' or 'async', got {mode!r}")
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the checkpoint to resume from), got {keep}")
        self.folder, self.mode, self.group, self.keep = location(folder), mode, group, keep
        self.pending = None  # the Future of the save still being written
        self.waited: list[float] = []  # per save: seconds spent waiting for the previous one
        self.stager = None  # async: the CPU copy of the state, reused from one save to the next

    def save(self, state, step: int, on_complete=None) -> float:
        """Checkpoint ``state`` as of ``step``; returns the seconds the save call held the
        caller up: blocking, the whole ``dcp.save``; async, ``async_save`` until it returns.
        Before that, an async save waits for the previous one if it is still being written
        (those seconds go to ``self.waited``). ``on_complete(step)`` is called once the save is
        complete on this rank (async: in the writing thread, as soon as it is), never if it failed."""
        start = time.perf_counter()
        self.wait()
        self.waited.append(time.perf_counter() - start)
        start = time.perf_counter()
        path = str(self.folder / f"step_{step:06d}")
        state = state if isinstance(state, dict) else {"app": state}
        save = self.save_blocking if self.mode == "blocking" else self.save_async
        save(state, path, step, on_complete)
        return time.perf_counter() - start

    def save_blocking(self, state: dict, path: str, step: int, on_complete=None) -> None:
        """``dcp.save``: returns once this rank's files are written, then prunes old folders."""
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=path, process_group=self.group)
        self._prune()
        if on_complete is not None:
            on_complete(step)

    def save_async(self, state: dict, path: str, step: int, on_complete=None) -> None:
        """``dcp.async_save``: returns once the state is staged; the write goes on in the background."""
        import torch.distributed.checkpoint as dcp

        if self.stager is None:
            self.stager = _reusable_stager()
        extra = {} if self.stager is None else {"async_stager": self.stager}
        response = dcp.async_save(state, checkpoint_id=path, process_group=self.group, **extra)
        # torch >= 2.9 may answer with an AsyncSaveResponse (staging and upload futures)
        self.pending = getattr(response, "upload_completion", response)
        if on_complete is not None:
            self.pending.add_done_callback(lambda f: f.exception() is None and on_complete(step))

    def wait(self) -> None:
        """Block until the save in the background (if any) is complete on this rank."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None
            self._prune()

    def close(self) -> None:
        """Wait for the last save, then free the staging buffers."""
        self.wait()
        if self.stager is not None:
            self.stager.close()
            self.stager = None

    def _prune(self) -> None:
        """Rank 0 deletes all but the last ``keep`` complete checkpoints, and every incomplete one
        older than the newest complete one (a save that was interrupted: it will never complete)."""
        if dist.get_rank(self.group) != 0:
            return
        for old in prunable(self.folder, self.keep):
            remove(old)


def _reusable_stager():
    """A staging area that keeps its CPU buffers from one ``async_save`` to the next (the
    default one is made and freed at every call, so each save allocates the whole state
    again), or None where this torch has no reusable ``DefaultStager`` (``versions.reusable_stager``)."""
    try:
        from torch.distributed.checkpoint.staging import StagingOptions
    except ImportError:
        return None
    return versions.reusable_stager(
        StagingOptions(
            use_pinned_memory=torch.cuda.is_available(),  # faster copies from the GPU
            use_shared_memory=False,
            use_async_staging=False,  # the copy is done when async_save returns
            use_non_blocking_copy=False,
        )
    )


def slowest_rank_stalls(results: list[dict], key: str = "stalls") -> list[float]:
    """Per checkpoint, the longest any rank spent in the save call (``key="waited"``: waiting
    for the previous save). ``results``: what :func:`train_big_table` returned on each rank.
    The next collective waits for the slowest rank, so that is the time the job stood still."""
    return [max(per_rank) for per_rank in zip(*(r[key] for r in results), strict=True)]


def train_big_table(
    folder: str | os.PathLike,
    *,
    steps: int,
    checkpoint_every: int = 0,
    mode: str = "blocking",
    resume: bool = False,
    stop_after: int | None = None,
    rows: int = 200_000,
    dim: int = 64,
    global_batch: int = 128,
    samples: int = 4096,
    bag: int = 8,
    seed: int = 0,
    storage=None,
) -> dict:
    """Every rank calls this (default process group up): DDP training of :class:`BigTableModel`
    with Adagrad on ``samples`` synthetic clicks (``bag`` ids each), ``global_batch`` samples a
    step split over the ranks (:class:`GlobalPositionSampler`), checkpointed with an
    :class:`AppState` every ``checkpoint_every`` steps (0: never) into ``folder``.

    ``resume``: start from :func:`latest_complete` (any world size). ``stop_after``: stop
    after that step (as if the job had been killed, once its last save was complete).
    ``storage``: on a modeled cluster, the saves take that storage's time
    (``modeled_io.ModeledCheckpointer``; "stalls" and "waited" are then modeled seconds).
    Returns ``{"weights" (rank 0's; {} on the others), "stalls" (seconds in the save call per
    checkpoint), "waited" (seconds waiting for the previous save first), "seen" (this rank's
    sample indices, in order), "started_at" (step resumed from), "checkpoint_bytes" (of the last one)}``.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    versions.quiet_dcp_storage_warning()
    world = dist.get_world_size()
    if global_batch % world:
        raise ValueError(f"global_batch={global_batch} must divide evenly over {world} ranks")
    per_rank = global_batch // world
    device = rank_device()  # under NCCL this rank's GPU, else the CPU
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(rows, (samples, bag), generator=generator).to(device)
    labels = torch.randint(0, 2, (samples,), generator=generator).float().to(device)

    module = BigTableModel(rows, dim, seed).to(device)
    # DDP averages the head's gradients; the table's sparse gradient is averaged after backward
    # (average_sparse_gradient says why)
    compat.ddp_ignore(module, ["table.weight"])
    model = DDP(module)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    sampler = GlobalPositionSampler(samples, seed=seed)
    app = AppState(model, optimizer, sampler)
    group = dist.new_group(backend="gloo")  # DCP's own collectives, apart from the training's
    checkpointer = Checkpointer(folder, mode, group, keep=1)  # disk: only the last complete one
    if storage is not None:
        from course_utils.checkpoint.modeled_io import ModeledCheckpointer

        checkpointer = ModeledCheckpointer(checkpointer, storage)
    started_at = 0
    if resume:
        from course_utils.checkpoint import safe_load

        path = latest_complete(folder)
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint (step_* with .metadata) in {folder}")
        safe_load.load({"app": app}, path, process_group=group)  # data only: no pickle is run
        started_at = app.step

    stalls, seen = [], []
    while app.step < steps and app.step != stop_after:
        order = list(sampler)
        for start in range(0, len(order) - per_rank + 1, per_rank):
            batch = order[start : start + per_rank]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_sparse_gradient(module.table.weight)
            with warnings.catch_warnings():  # Adagrad's sparse update: a note about invariant checks
                warnings.filterwarnings("ignore", message="Sparse invariant checks", category=UserWarning)
                optimizer.step()
            sampler.advance(per_rank)
            app.step += 1
            seen += batch
            if checkpoint_every and app.step % checkpoint_every == 0:
                stalls.append(checkpointer.save(app, app.step))
            if app.step in (steps, stop_after):
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    checkpointer.close()
    last = latest_complete(folder) if checkpoint_every else None
    weights = {}
    if dist.get_rank() == 0:
        weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return {
        "weights": weights,
        "stalls": stalls,
        "waited": checkpointer.waited,
        "seen": seen,
        "started_at": started_at,
        "checkpoint_bytes": folder_bytes(last) if last else 0,
    }
