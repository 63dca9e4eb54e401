"""Sharded state: every rank writes its own pieces with ``torch.distributed.checkpoint`` (DCP).

The model says what to save (``ShardedModel``): ``model.checkpoint_entries()`` lists its
tensors as ``(name, parameter, place)``. ``name`` is the same on every rank and in every
sharding plan (``embeddings.table3``, ``dense.bottom.0.weight``); ``place`` turns this
rank's piece (the parameter, or optimizer state shaped like it) into what DCP saves: a
DTensor that knows its place in the whole tensor (a shard of a table,
``course_utils.sharding.dtensor.as_dtensor``), or None for a tensor saved as it is (a
whole table, or the replicated MLPs, which DCP writes once). Because every piece knows
its place, a checkpoint loads into another number of ranks, another plan, or whole into
one process.

Taught in chapter 08 (section 3, sharded state).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Protocol

import torch

from course_utils.runtime import versions

__all__ = [
    "ShardedModel",
    "checkpoint_entries",
    "sharded_state_dict",
    "save_sharded",
    "load_sharded",
    "load_full_tables",
]

#: ``(name, parameter, place)``: see the module's docstring.
Entry = tuple[str, torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | None]


class ShardedModel(Protocol):
    """What ``save_sharded`` and ``load_sharded`` need of a model (``HybridDLRM`` provides it)."""

    def checkpoint_entries(self) -> list[Entry]:
        """``[(name, parameter, place)]`` for every tensor to save (see the module's docstring)."""


def checkpoint_entries(model: ShardedModel) -> list[Entry]:
    """``model.checkpoint_entries()``, with a clear error for a model that has none."""
    if not hasattr(model, "checkpoint_entries"):
        raise TypeError(
            f"{type(model).__name__} has no checkpoint_entries(): a sharded checkpoint needs the "
            "model to list [(name, parameter, place)] (see ShardedModel; HybridDLRM has one)"
        )
    return model.checkpoint_entries()


def sharded_state_dict(model, optimizer) -> dict:
    """A flat DCP state dict of a model (a ``ShardedModel``, such as the hybrid DLRM) and its
    optimizer: ``model/<name>`` and ``optim/<name>/<state>`` (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``)."""
    out = {}
    for name, p, place in checkpoint_entries(model):
        place = place or (lambda t: t)
        out[f"model/{name}"] = place(p.detach())
        for key, value in optimizer.state.get(p, {}).items():
            out[f"optim/{name}/{key}"] = place(value) if torch.is_tensor(value) and value.dim() else value
    return out


def save_sharded(model, optimizer, path: str | os.PathLike, progress: dict | None = None) -> None:
    """Every rank calls this: DCP writes each rank's pieces (and one copy of the replicated
    ones) into the folder ``path``. ``progress``: ints such as ``{"step": 40}``, saved too."""
    import torch.distributed.checkpoint as dcp

    state = sharded_state_dict(model, optimizer)
    state.update({f"progress/{k}": torch.tensor(v) for k, v in (progress or {}).items()})
    versions.quiet_dcp_storage_warning()
    dcp.save(state, checkpoint_id=str(path))


def load_sharded(model, optimizer, path: str | os.PathLike) -> dict:
    """Every rank calls this: fill ``model``'s shards and MLPs and ``optimizer``'s state from a
    :func:`save_sharded` checkpoint, which may have been written by another number of ranks or
    another (DTensor-describable) plan. Returns the saved progress as ints."""
    from course_utils.checkpoint import safe_load

    saved = safe_load.read_metadata(path).state_dict_metadata
    state, targets = {}, []
    for name, p, place in checkpoint_entries(model):
        place = place or (lambda t: t)
        state[f"model/{name}"] = place(torch.empty_like(p.detach()))
        targets.append((f"model/{name}", p, None))
        for key in sorted(k for k in saved if k.startswith(f"optim/{name}/")):
            meta = saved[key]
            scalar = len(meta.size) == 0
            blank = torch.empty((), dtype=meta.properties.dtype) if scalar else torch.empty_like(p.detach())
            state[key] = blank if scalar else place(blank)
            targets.append((key, p, key.rsplit("/", 1)[1]))
    state.update({k: torch.tensor(0) for k in saved if k.startswith("progress/")})
    safe_load.load(state, path)  # reads data only: no pickle from the folder is run
    for key, p, slot in targets:
        value = state[key]
        value = value.to_local() if hasattr(value, "to_local") else value
        if slot is None:
            with torch.no_grad():
                p.copy_(value)
        else:
            optimizer.state[p][slot] = value.clone()
    return {k.split("/", 1)[1]: int(v) for k, v in state.items() if k.startswith("progress/")}


def load_full_tables(path: str | os.PathLike, cardinalities, dim: int) -> list[torch.Tensor]:
    """The whole tables ``[N_t, dim]`` from a :func:`save_sharded` checkpoint, in one process
    (no process group needed): DCP reads every rank's pieces into full tensors."""
    from course_utils.checkpoint import safe_load

    state = {f"model/embeddings.table{t}": torch.empty(n, dim) for t, n in enumerate(cardinalities)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        safe_load.load(state, path)
    return [state[f"model/embeddings.table{t}"] for t in range(len(cardinalities))]
