"""Checkpoints that make a resumed run continue exactly where the interrupted one stopped.

Two ways to save, for the two ways a model is spread over ranks:

* **replicated state** (DDP: every rank has the same model): rank 0 writes one file
  with ``torch.save``, between two barriers (:func:`save_on_rank0`), and every rank
  reads it back (:func:`load_on_every_rank`). The file is written under a temporary
  name and renamed, so a rank killed mid-save never leaves half a checkpoint.
* **sharded state** (the hybrid DLRM: each rank holds different rows of the tables):
  every rank writes its own pieces with ``torch.distributed.checkpoint`` (DCP)
  (:func:`save_sharded`). Shards are saved as DTensors that know their place in the
  whole table, so the checkpoint can be loaded by a different number of ranks, or
  whole by one process (:func:`load_sharded`, :func:`load_full_tables`).

A resume must restore everything the next step depends on: the weights, the
optimizer's state (Adam's moments and step count), and the position in the data
(:class:`ResumableSampler`: the epoch and how many samples of it were used).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

__all__ = ["young_daly_interval", "settle_ddp_buckets", "save_on_rank0", "load_on_every_rank", "ResumableSampler", "training_state",
           "restore_training_state", "sharded_state_dict", "save_sharded", "load_sharded",
           "load_full_tables"]


def young_daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """How often to checkpoint: ``sqrt(2 * C * M)`` seconds between checkpoints (Young 1974, Daly 2006).

    Saving every ``tau`` seconds costs ``C / tau`` of the time; a failure, every ``M`` seconds
    on average, loses ``tau / 2`` of work on average, ``tau / (2 M)`` of the time. The sum is
    smallest at ``tau = sqrt(2 C M)`` (first order, for ``C`` much smaller than ``M``).
    """
    if save_seconds <= 0 or mtbf_seconds <= 0:
        raise ValueError(f"save_seconds and mtbf_seconds must be positive, got {save_seconds}, {mtbf_seconds}")
    return (2.0 * save_seconds * mtbf_seconds) ** 0.5


def settle_ddp_buckets(ddp_model, *example_inputs) -> None:
    """One throwaway forward and backward, so that DDP has fixed its gradient buckets.

    DDP first packs the gradients into buckets in reverse parameter order, then, at the
    second forward, repacks them in the order the first backward produced them. With
    more than two ranks the all-reduce adds the ranks' values in an order that depends
    on a value's position in its bucket, so a freshly built DDP (a resumed run) would add
    in another order than a long-running one and drift in the last bits. Calling this
    right after wrapping, in every run, gives every run the same buckets from step 1.
    The gradients it makes are dropped; nothing else changes.
    """
    ddp_model(*example_inputs).sum().backward()
    for p in ddp_model.parameters():
        p.grad = None


# --- replicated state: rank 0 writes ------------------------------------------------------

def save_on_rank0(state: dict, path: str | os.PathLike) -> None:
    """Every rank calls this; rank 0 writes ``state`` to ``path`` (atomically).

    The first barrier makes sure every rank has finished the step being saved; the
    second that no rank goes on to read (or to crash) before the file is complete.
    """
    dist.barrier()
    if dist.get_rank() == 0:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)          # atomic: the old checkpoint or the new one, never half of one
    dist.barrier()


def load_on_every_rank(path: str | os.PathLike, map_location="cpu") -> dict | None:
    """The checkpoint at ``path`` (tensors only: ``weights_only=True``), or None if there is none."""
    if not Path(path).exists():
        return None
    return torch.load(path, map_location=map_location, weights_only=True)


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` that can start in the middle of an epoch.

    ``DistributedSampler`` shuffles with ``seed + epoch`` (call ``set_epoch`` every epoch)
    and gives each rank every ``W``-th index. This subclass also counts the samples this
    rank has consumed (``advance(n)`` after each batch), saves ``{epoch, consumed}`` in
    ``state_dict()``, and after ``load_state_dict`` skips the consumed ones: the resumed
    run sees exactly the batches the interrupted run had not seen.
    """

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, **kwargs)
        self.consumed = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.consumed = 0
        super().set_epoch(epoch)

    def advance(self, n: int) -> None:
        self.consumed += n

    def __iter__(self):
        return iter(list(super().__iter__())[self.consumed:])

    def __len__(self) -> int:
        return self.num_samples - self.consumed

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def training_state(model, optimizer, sampler: ResumableSampler, step: int) -> dict:
    """Everything a replicated (DDP) run needs to continue: weights, optimizer state,
    data position, step count and the torch random state."""
    return {"model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
            "sampler": sampler.state_dict(), "step": step, "rng": torch.get_rng_state()}


def restore_training_state(state: dict, model, optimizer, sampler: ResumableSampler) -> int:
    """Put a :func:`training_state` back; returns the step it was saved at."""
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"].cpu())
    return int(state["step"])


# --- sharded state: every rank writes its pieces with DCP ---------------------------------

def _placed(model, index: int, local: torch.Tensor):
    """Shard ``index`` of this rank as what DCP should save: a DTensor that knows its place
    in the whole table (row-wise range: ``Shard(0)``, column-wise: ``Shard(1)``), or the
    whole table itself (table-wise: only its owner has the key)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    plan = model.embeddings.plan
    if plan.kind == "table_wise":
        return local
    if plan.kind == "row_wise" and plan.row_split == "hash":
        raise ValueError("a hash (modulo) row split gives each rank every W-th row, which DTensor cannot "
                         "describe (its shards are contiguous blocks); checkpoint a range-split plan")
    if getattr(model.embeddings, "_mesh", None) is None:   # one mesh per model: all the ranks, in order
        model.embeddings._mesh = init_device_mesh(local.device.type, (plan.world_size,))
    mesh = model.embeddings._mesh
    shape = (plan.cardinalities[model.embeddings.shards[index].table], plan.dim)
    return DTensor.from_local(local, mesh, [Shard(0 if plan.kind == "row_wise" else 1)],
                              run_check=False, shape=shape, stride=(plan.dim, 1))


def _named_parameters(model) -> list:
    """``[(global name, parameter, shard index or None)]``: table shards are named by their
    table (``embeddings.table3``), the same on every rank and in every plan."""
    named = [(f"embeddings.table{s.table}", w, i)
             for i, (s, w) in enumerate(zip(model.embeddings.shards, model.embeddings.weights))]
    named += [(f"dense.{name}", p, None) for name, p in model.dense.module.named_parameters()]
    return named


def sharded_state_dict(model, optimizer) -> dict:
    """A flat DCP state dict of a :class:`~course_utils.hybrid.HybridDLRM` and its optimizer:
    ``model/<name>`` and ``optim/<name>/<state>`` (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``)."""
    out = {}
    for name, p, shard in _named_parameters(model):
        place = (lambda t: _placed(model, shard, t)) if shard is not None else (lambda t: t)
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
    with warnings.catch_warnings():  # torch 2.9's DCP writer calls tensor.storage() itself
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        dcp.save(state, checkpoint_id=str(path))


def load_sharded(model, optimizer, path: str | os.PathLike) -> dict:
    """Every rank calls this: fill ``model``'s shards and MLPs and ``optimizer``'s state from a
    :func:`save_sharded` checkpoint, which may have been written by another number of ranks or
    another (DTensor-describable) plan. Returns the saved progress as ints."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state, targets = {}, []
    for name, p, shard in _named_parameters(model):
        place = (lambda t: _placed(model, shard, t)) if shard is not None else (lambda t: t)
        state[f"model/{name}"] = place(torch.empty_like(p.detach()))
        targets.append((f"model/{name}", p, None))
        for key in sorted(k for k in saved if k.startswith(f"optim/{name}/")):
            meta = saved[key]
            scalar = len(meta.size) == 0
            blank = torch.empty((), dtype=meta.properties.dtype) if scalar else torch.empty_like(p.detach())
            state[key] = blank if scalar else place(blank)
            targets.append((key, p, key.rsplit("/", 1)[1]))
    state.update({k: torch.tensor(0) for k in saved if k.startswith("progress/")})
    dcp.load(state, checkpoint_id=str(path))
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
    import torch.distributed.checkpoint as dcp

    state = {f"model/embeddings.table{t}": torch.empty(n, dim) for t, n in enumerate(cardinalities)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, checkpoint_id=str(path))
    return [state[f"model/embeddings.table{t}"] for t in range(len(cardinalities))]
