"""Data-parallel training for every DDP of the course, and its single-process twin.

``ddp_worker`` runs on each rank (under ``launch`` or torchrun); ``train_single``
runs in one process on the *global* batches, the concatenation of what the ranks
get at each step. Same model seed, same data order, same loop, so after N steps
the parameters agree up to float rounding. The loop is ``course_utils.workload.train.fit``:

    per step, on every rank
        batch = this rank's share of the global batch          # rank_loader
        loss  = BCE(model(batch)), mean over this rank's rows
        loss.backward()
        finish_gradient_sync(model)                            # by-hand DDPs: average the gradients
        optimizer.step(); scheduler.step()                     # (torch DDP did it inside backward)

The mean of the ranks' mean gradients is the mean gradient of the global batch
because every rank has the same number of rows.

Taught in chapter 04.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_utils.ddp.bucketed import BucketedDDP
from course_utils.ddp.naive import NaiveDDP
from course_utils.runtime.hardware import devices, rank_device
from course_utils.workload.data import Batch, ClickLogs
from course_utils.workload.data.loaders import GlobalBatches, rank_loader, sampler_indices
from course_utils.workload.models import DLRMConfig
from course_utils.workload.train import History, evaluate, finish_gradient_sync, fit, make_optimizer

__all__ = [
    "DDP_KINDS",
    "TrainSettings",
    "wrap",
    "finish_gradient_sync",
    "sampler_indices",
    "rank_loader",
    "global_loader",
    "rank_batches",
    "global_batches",
    "ddp_worker",
    "train_single",
    "max_difference",
]

DDP_KINDS = ("naive", "bucketed", "torch")


@dataclass(frozen=True)
class TrainSettings:
    """What a run does; the same object drives every rank and the single-process twin.

    global_batch_size: rows per optimizer step, summed over the ranks.
    max_steps: stop after this many steps (None: run ``epochs`` full epochs).
    warmup_steps: the learning rate climbs linearly from lr/warmup_steps to lr.
    accumulation_steps: micro-batches per step; all but the last run under ``no_sync``.
    seed / model_seed: data order and initial weights. set_epoch: reshuffle every epoch.
    in_memory: parquet data only: each rank reads its share once and keeps it, instead of
        streaming its row groups (same batches either way).
    """

    global_batch_size: int = 1024
    epochs: int = 1
    max_steps: int | None = None
    lr: float = 1e-3
    optimizer: str = "adam"
    warmup_steps: int = 0
    accumulation_steps: int = 1
    seed: int = 0
    model_seed: int = 0
    set_epoch: bool = True
    in_memory: bool = False

    def per_rank_batch(self, world_size: int) -> int:
        """Rows per rank per step; the global batch must split evenly into ranks and micro-batches."""
        parts = world_size * self.accumulation_steps
        if self.global_batch_size % parts:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} does not split into {world_size} "
                f"ranks x {self.accumulation_steps} micro-batches; use a multiple of {parts}"
            )
        return self.global_batch_size // world_size


def wrap(model: nn.Module, kind: str, **options) -> nn.Module:
    """``model`` wrapped for data parallel training: ``"naive"``, ``"bucketed"`` or ``"torch"``.

    A model on a GPU gets ``device_ids=[its GPU]`` for torch DDP (one GPU per process)."""
    makers = {"naive": NaiveDDP, "bucketed": BucketedDDP, "torch": DistributedDataParallel}
    if kind not in makers:
        raise ValueError(f"kind must be one of {DDP_KINDS}, got {kind!r}")
    device = next(model.parameters()).device
    if kind == "torch" and device.type == "cuda":
        options = {"device_ids": [device], **options}
    return makers[kind](model, **options)


def global_loader(
    data: ClickLogs | str | Path, world_size: int, batch_size: int, seed: int = 0, in_memory: bool = False
) -> GlobalBatches:
    """What one process trains on to train like ``world_size`` ranks: at each step the ranks'
    batches (``rank_loader``) concatenated in rank order, ``[world_size * batch_size, ...]``."""
    return GlobalBatches(
        [rank_loader(data, rank, world_size, batch_size, seed, in_memory) for rank in range(world_size)]
    )


def rank_batches(
    data: ClickLogs | str | Path,
    rank: int,
    world_size: int,
    batch_size: int,
    epoch: int,
    seed: int = 0,
    set_epoch: bool = True,
) -> list[Batch]:
    """This rank's batches of ``batch_size`` rows for one epoch, all made at once: to look at them.
    Training takes them one at a time from ``rank_loader`` instead.

    data: ``ClickLogs`` in memory (every rank holds them; ``DistributedSampler``
        picks this rank's rows), or a parquet path (this rank reads only its own
        row groups, in an order shuffled with ``seed + epoch``; every rank takes
        as many full batches as the smallest share allows, so all step together).
    """
    loader = rank_loader(data, rank, world_size, batch_size, seed)
    loader.set_epoch(epoch if set_epoch else 0)
    return list(loader)


def global_batches(
    data, world_size: int, batch_size: int, epoch: int, seed: int = 0, set_epoch: bool = True
) -> list[Batch]:
    """The batches of ``global_loader`` for one epoch, all made at once."""
    loader = global_loader(data, world_size, batch_size, seed)
    loader.set_epoch(epoch if set_epoch else 0)
    return list(loader)


def _evaluate(model: nn.Module, eval_data: ClickLogs) -> dict:
    module = getattr(model, "module", model)
    on_cpu = module if next(module.parameters()).device.type == "cpu" else copy.deepcopy(module).cpu()
    return evaluate(on_cpu, eval_data)


def _run(model: nn.Module, loader, settings: TrainSettings, eval_data, device, **options) -> History:
    """``fit`` with ``settings``; the History keeps the final weights (CPU copies) in ``state``."""
    optimizer = make_optimizer(model, settings.optimizer, settings.lr)
    history = fit(
        model,
        loader,
        optimizer,
        epochs=settings.epochs,
        max_steps=settings.max_steps,
        accumulation_steps=settings.accumulation_steps,
        warmup_steps=settings.warmup_steps,
        set_epoch=settings.set_epoch,
        device=device,
        score=None if eval_data is None else lambda: _evaluate(model, eval_data),
        **options,
    )
    module = getattr(model, "module", model)
    history.state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return history


def ddp_worker(
    kind: str,
    data,
    model_config: DLRMConfig,
    settings: TrainSettings,
    eval_data: ClickLogs | None = None,
    **wrap_options,
) -> History:
    """Train on this rank as part of data parallel training; call it on every rank.

    Each rank builds its model with seed ``model_seed + rank`` (as if each process
    drew its own random weights); wrapping it broadcasts rank 0's, so every rank
    starts from ``model_seed``'s weights, like ``train_single``.
    Returns a :class:`~course_utils.workload.train.History`: ``step_loss`` (the global batch's loss per
    step, averaged over ranks), ``samples`` (global), ``collectives``, ``state`` (this rank's
    final state_dict), and on rank 0 ``final["auc"]``/``["logloss"]`` on ``eval_data``.
    """
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    model = wrap(model_config.build(seed=settings.model_seed + rank).to(device), kind, **wrap_options)
    loader = rank_loader(
        data, rank, world_size, settings.per_rank_batch(world_size), settings.seed, settings.in_memory
    )
    dist.barrier()
    history = _run(
        model,
        loader,
        settings,
        eval_data if rank == 0 else None,
        device,
        distributed=True,
        desc=f"rank {rank}",
    )
    history.kind, history.rank = kind, rank
    history.collectives = getattr(model, "collectives_launched", None)
    return history


def train_single(
    data,
    model_config: DLRMConfig,
    settings: TrainSettings,
    world_size: int = 1,
    eval_data: ClickLogs | None = None,
    desc: str = "single process",
    parallel=None,
    device: torch.device | str | None = None,
    live: bool = True,
) -> History:
    """Train in this process on the global batches of ``world_size`` ranks (see ``global_loader``).

    ``world_size=1`` is plain single-process training. ``parallel``: a function that
    wraps the model (built on the CPU), e.g. in ``DataParallelByHand``, and puts it on
    its devices; the batches then go where its parameters are. Otherwise the model
    and batches live on ``device``, by default where rank 0 of ``world_size`` ranks
    would train (``devices(world_size)[0]``: ``cuda:0`` when every rank gets a GPU,
    else the CPU), so the twin runs on the device of the runs it is compared with.
    Returns a History like ``ddp_worker``'s. ``live``: a progress line while it trains (in a
    notebook, an output area updated in place and emptied at the end).
    """
    model = model_config.build(seed=settings.model_seed)
    if parallel is not None:
        model = parallel(model)
        device = next(model.parameters()).device
    else:
        device = torch.device(device) if device is not None else devices(world_size, quiet=True)[0]
        model = model.to(device)
    loader = global_loader(
        data, world_size, settings.per_rank_batch(world_size), settings.seed, settings.in_memory
    )
    return _run(model, loader, settings, eval_data, device, desc=desc, live=live)


def max_difference(state_a: dict, state_b: dict) -> float:
    """Largest ``|a - b|`` over all entries of two state_dicts with the same keys and shapes."""
    if state_a.keys() != state_b.keys():
        raise ValueError(f"the state_dicts differ in keys: {sorted(set(state_a) ^ set(state_b))[:5]}")
    return max(float((state_a[k].double() - state_b[k].double()).abs().max()) for k in state_a)
