"""A production job's checkpoint: sharded model and optimizer, progress, every rank's random state.

One flat dict of tensors that ``dcp.save`` or ``dcp.async_save`` writes (``Checkpointer`` does
either), and nothing else: no pickled value, so that loading it runs no code (``safe_load``):

* ``model/<name>``, ``optim/<name>/<state>``: the sharded tables as DTensors, the replicated
  MLPs once (:func:`~course_utils.checkpoint.sharded.sharded_state_dict`);
* ``progress/<name>``: ints the same on every rank (step, epoch), as 0-d tensors;
* ``data/history``: the epoch's history, the layouts that worked on it so far, as
  ``[(world_size, rows per rank per batch, batches)]`` (``workload.data.epoch_position``): JSON
  text, as a ``uint8`` tensor of its bytes;
* ``rng/rank<R>/...``: rank ``R``'s random generators (``random_state``), under its own keys.

:func:`load_job` fills a model and an optimizer from such a folder, written by this number
of ranks or another (DCP reshards the tables), restores this rank's random state when the
checkpoint has one for it, and returns the progress. It refuses a folder that holds any
pickled value (``CheckpointRefused``, one line).

Taught in chapter 08 (the production job, ``course_utils.scripts.train_hybrid``).
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from course_utils.checkpoint import random_state, safe_load
from course_utils.checkpoint.folders import is_url
from course_utils.checkpoint.sharded import load_sharded, sharded_state_dict

__all__ = ["job_state", "load_job", "refuse_pickles", "whole_state", "tensors_that_differ"]


HISTORY = "data/history"


def json_tensor(value) -> torch.Tensor:
    """``value`` as JSON text in a ``uint8`` tensor of its bytes (``[length]``)."""
    return torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8)


def from_json_tensor(tensor: torch.Tensor):
    """The value :func:`json_tensor` stored."""
    return json.loads(bytes(tensor.tolist()).decode())


def job_state(model, optimizer, progress: dict[str, int], history: list) -> dict:
    """What every rank passes to ``dcp.save``/``async_save``: see the module's docstring."""
    state = sharded_state_dict(model, optimizer)
    state.update({f"progress/{k}": torch.tensor(int(v)) for k, v in progress.items()})
    state[HISTORY] = json_tensor([list(segment) for segment in history])
    prefix = random_state.key_of(dist.get_rank())
    state.update({prefix + k: v for k, v in random_state.capture().items()})
    return state


def refuse_pickles(path: str | os.PathLike) -> None:
    """Raise ``CheckpointRefused`` if the checkpoint folder ``path`` (or URL) holds any value that
    is not a tensor: this job writes none, and loading one would unpickle it."""
    pickled = safe_load.non_tensor_entries(path)
    if pickled:
        flag = "--checkpoint-url" if is_url(path) else "--checkpoint-dir"
        raise safe_load.CheckpointRefused(
            f"{path} holds {len(pickled)} pickled value(s) ({', '.join(pickled[:3])}), which this job "
            "never writes; loading them could run code, so the folder is not loaded: use a checkpoint "
            f"folder only you can write (or a new {flag})"
        )


def load_job(model, optimizer, path: str | os.PathLike, seed: int = 0) -> dict[str, int]:
    """Every rank calls this: weights, optimizer state and this rank's random state from the
    checkpoint folder ``path`` (or a URL, ``s3://bucket/job/step_000020``; a rank the checkpoint
    has no random state for, after a resize, is seeded with ``seed + rank``). Returns the saved
    progress, plus ``"history"`` (the epoch's layouts, a list of tuples) and ``"rng_restored"``
    (0 or 1). Refuses a folder with pickled values (``refuse_pickles``)."""
    refuse_pickles(path)
    progress = load_sharded(model, optimizer, path)
    prefix = random_state.key_of(dist.get_rank())
    saved = safe_load.read_metadata(path).state_dict_metadata
    mine = [k for k in saved if k == HISTORY or k.startswith(prefix)]
    state = {k: torch.empty(tuple(saved[k].size), dtype=saved[k].properties.dtype) for k in mine}
    safe_load.load(state, path)
    rng = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    if rng:
        random_state.restore(rng)
    else:
        random_state.seed_all(seed + dist.get_rank())
    history = [tuple(segment) for segment in from_json_tensor(state[HISTORY])]
    return {**progress, "history": history, "rng_restored": int(bool(rng))}


def whole_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every ``model/...`` and ``optim/...`` tensor of a checkpoint folder, whole (tables
    reassembled from every rank's shards), read in one process with no process group."""
    import warnings

    saved = safe_load.read_metadata(path).state_dict_metadata
    state = {
        k: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for k, meta in saved.items()
        if k.startswith(("model/", "optim/")) and hasattr(meta, "size")
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        safe_load.load(state, path)
    return state


def tensors_that_differ(a: str | os.PathLike, b: str | os.PathLike) -> tuple[int, int]:
    """``(differing, total)``: how many tensors of two checkpoint folders are not bit-identical
    (``torch.equal``; a tensor only one of them has counts as differing), out of how many names."""
    first, second = whole_state(a), whole_state(b)
    names = first.keys() | second.keys()
    same = sum(k in first and k in second and torch.equal(first[k], second[k]) for k in names)
    return len(names) - same, len(names)
