"""A production job's checkpoint: sharded model and optimizer, progress, every rank's random state.

One flat dict that ``dcp.save`` or ``dcp.async_save`` writes (``Checkpointer`` does either):

* ``model/<name>``, ``optim/<name>/<state>``: the sharded tables as DTensors, the replicated
  MLPs once (:func:`~course_utils.checkpoint.sharded.sharded_state_dict`);
* ``progress/<name>``: ints the same on every rank (step, epoch);
* ``data/history``: the epoch's history, the layouts that worked on it so far, as
  ``[(world_size, rows per rank per batch, batches)]`` (``workload.data.epoch_position``), in JSON;
* ``rng/rank<R>``: rank ``R``'s random generators (``random_state``), one key per rank.

:func:`load_job` fills a model and an optimizer from such a folder, written by this number
of ranks or another (DCP reshards the tables), restores this rank's random state when the
checkpoint has one for it, and returns the progress.

Taught in chapter 08 (the production job, ``course_utils.scripts.train_hybrid``).
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from course_utils.checkpoint import random_state
from course_utils.checkpoint.sharded import load_sharded, sharded_state_dict

__all__ = ["job_state", "load_job", "whole_state", "tensors_that_differ"]


HISTORY = "data/history"


def job_state(model, optimizer, progress: dict[str, int], history: list) -> dict:
    """What every rank passes to ``dcp.save``/``async_save``: see the module's docstring."""
    state = sharded_state_dict(model, optimizer)
    state.update({f"progress/{k}": torch.tensor(int(v)) for k, v in progress.items()})
    state[HISTORY] = json.dumps([list(segment) for segment in history])
    state[random_state.key_of(dist.get_rank())] = random_state.capture()
    return state


def load_job(model, optimizer, path: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Every rank calls this: weights, optimizer state and this rank's random state from the
    checkpoint folder ``path`` (a rank the checkpoint has no random state for, after a resize,
    is seeded with ``seed + rank``). Returns the saved progress, plus ``"history"`` (the epoch's
    layouts, a list of tuples) and ``"rng_restored"`` (0 or 1)."""
    import torch.distributed.checkpoint as dcp

    progress = load_sharded(model, optimizer, path)
    key = random_state.key_of(dist.get_rank())
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {HISTORY: ""} | ({key: b""} if key in saved else {})
    dcp.load(state, checkpoint_id=str(path))
    if key in saved:
        random_state.restore(state[key])
    else:
        random_state.seed_all(seed + dist.get_rank())
    history = [tuple(segment) for segment in json.loads(state[HISTORY])]
    return {**progress, "history": history, "rng_restored": int(key in saved)}


def whole_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every ``model/...`` and ``optim/...`` tensor of a checkpoint folder, whole (tables
    reassembled from every rank's shards), read in one process with no process group."""
    import warnings

    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {
        k: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for k, meta in saved.items()
        if k.startswith(("model/", "optim/")) and hasattr(meta, "size")
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, checkpoint_id=str(path))
    return state


def tensors_that_differ(a: str | os.PathLike, b: str | os.PathLike) -> tuple[int, int]:
    """``(differing, total)``: how many tensors of two checkpoint folders are not bit-identical
    (``torch.equal``; a tensor only one of them has counts as differing), out of how many names."""
    first, second = whole_state(a), whole_state(b)
    names = first.keys() | second.keys()
    same = sum(k in first and k in second and torch.equal(first[k], second[k]) for k in names)
    return len(names) - same, len(names)
