"""One data-parallel training loop for every DDP of the course, and its single-process twin.

``ddp_worker`` runs on each rank (under ``launch`` or torchrun); ``train_single``
runs in one process on the *global* batches, the concatenation of what the ranks
get at each step. Same model seed, same data order, same loop, so after N steps
the parameters agree up to float rounding:

    per step, on every rank
        batch = this rank's share of the global batch          # rank_batches
        loss  = BCE(model(batch)), mean over this rank's rows
        loss.backward()
        finish_gradient_sync(model)                            # by-hand DDPs: average the gradients
        optimizer.step(); scheduler.step()                     # (torch DDP did it inside backward)

The mean of the ranks' mean gradients is the mean gradient of the global batch
because every rank has the same number of rows.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from ..data import Batch, ClickLogs, parquet_info, read_parquet, row_groups_of_rank
from ..hardware import devices, rank_device
from ..models import DLRMConfig
from ..progress import Progress
from ..timing import Stopwatch, synchronize
from ..train import evaluate, make_optimizer
from .bucketed import BucketedDDP
from .naive import NaiveDDP

__all__ = ["KINDS", "TrainSettings", "wrap", "rank_device", "finish_gradient_sync", "sampler_indices", "rank_batches",
           "global_batches", "ddp_worker", "train_single", "max_difference"]

KINDS = ("naive", "bucketed", "torch")


@dataclass(frozen=True)
class TrainSettings:
    """What a run does; the same object drives every rank and the single-process twin.

    global_batch_size: rows per optimizer step, summed over the ranks.
    max_steps: stop after this many steps (None: run ``epochs`` full epochs).
    warmup_steps: the learning rate climbs linearly from lr/warmup_steps to lr.
    accumulation_steps: micro-batches per step; all but the last run under ``no_sync``.
    seed / model_seed: data order and initial weights. set_epoch: reshuffle every epoch.
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

    def per_rank_batch(self, world_size: int) -> int:
        """Rows per rank per step; the global batch must split evenly into ranks and micro-batches."""
        parts = world_size * self.accumulation_steps
        if self.global_batch_size % parts:
            raise ValueError(f"global_batch_size={self.global_batch_size} does not split into {world_size} "
                             f"ranks x {self.accumulation_steps} micro-batches; use a multiple of {parts}")
        return self.global_batch_size // world_size


def wrap(model: nn.Module, kind: str, **options) -> nn.Module:
    """``model`` wrapped for data parallel training: ``"naive"``, ``"bucketed"`` or ``"torch"``.

    A model on a GPU gets ``device_ids=[its GPU]`` for torch DDP (one GPU per process)."""
    makers = {"naive": NaiveDDP, "bucketed": BucketedDDP, "torch": DistributedDataParallel}
    if kind not in makers:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    device = next(model.parameters()).device
    if kind == "torch" and device.type == "cuda":
        options = {"device_ids": [device], **options}
    return makers[kind](model, **options)


def finish_gradient_sync(model: nn.Module) -> None:
    """The by-hand DDPs average gradients here; torch DDP already did, inside backward."""
    finish = getattr(model, "finish_gradient_sync", None)
    if finish is not None:
        finish()


def sampler_indices(n_rows: int, rank: int, world_size: int, epoch: int, seed: int = 0,
                    set_epoch: bool = True) -> list[int]:
    """Row indices rank ``rank`` visits in ``epoch``, from ``torch.utils.data.DistributedSampler``.

    The sampler shuffles all rows with seed ``seed + epoch`` (the epoch comes from
    ``set_epoch``; without it, every epoch is epoch 0), pads the list to a multiple of
    ``world_size`` by repeating its start, and gives rank r positions r, r + W, r + 2W, ...
    """
    sampler = DistributedSampler(range(n_rows), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    if set_epoch:
        sampler.set_epoch(epoch)
    return list(sampler)


def rank_batches(data: ClickLogs | str | Path, rank: int, world_size: int, batch_size: int, epoch: int,
                 seed: int = 0, set_epoch: bool = True) -> list[Batch]:
    """This rank's batches of ``batch_size`` rows for one epoch.

    data: ``ClickLogs`` in memory (every rank holds them; ``DistributedSampler``
        picks this rank's rows), or a parquet path (this rank reads only its own
        row groups and shuffles them with ``seed + epoch``; every rank takes
        as many full batches as the smallest share allows, so all step together).
    """
    if isinstance(data, ClickLogs):
        idx = np.asarray(sampler_indices(len(data), rank, world_size, epoch, seed, set_epoch))
        return [data[idx[i:i + batch_size]].to_torch() for i in range(0, len(idx), batch_size)]
    rows_per_group = parquet_info(data)["rows_per_group"]
    steps = min(sum(rows_per_group[g] for g in row_groups_of_rank(len(rows_per_group), r, world_size, data))
                for r in range(world_size)) // batch_size
    mine = read_parquet(data, rank, world_size)
    return list(mine.batches(batch_size, shuffle=True, seed=seed + epoch if set_epoch else seed))[:steps]


def global_batches(data, world_size: int, batch_size: int, epoch: int, seed: int = 0,
                   set_epoch: bool = True) -> list[Batch]:
    """What one process sees to train like ``world_size`` ranks: at each step the ranks'
    batches concatenated in rank order, ``[world_size * batch_size, ...]``."""
    per_rank = [rank_batches(data, r, world_size, batch_size, epoch, seed, set_epoch) for r in range(world_size)]
    return [Batch(*(torch.cat(parts) for parts in zip(*step))) for step in zip(*per_rank)]


def _loop(model: nn.Module, batches_of_epoch, settings: TrainSettings, desc: str, live: bool,
          device: torch.device = torch.device("cpu")) -> dict:
    """The loop itself, shared by the ranks and the single process (see the module docstring)."""
    optimizer = make_optimizer(model, settings.optimizer, settings.lr)
    warm = max(settings.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warm))
    epochs = [batches_of_epoch(e) for e in range(settings.epochs)]
    total = sum(len(b) for b in epochs)
    total = total if settings.max_steps is None else min(total, settings.max_steps)
    losses, step_seconds, samples = [], [], 0
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    in_use = getattr(model, "devices", [device])    # DataParallelByHand works on several
    model.train()
    with Progress(total, desc, mode=None if live else "nowhere") as bar:
        for batch in (b for epoch in epochs for b in epoch):
            if len(losses) == total:
                break
            synchronize(*in_use)                       # GPU work is asynchronous: time it once it is done
            start = time.perf_counter()
            micro = list(zip(*(t.to(device).chunk(settings.accumulation_steps) for t in batch)))
            step_loss = 0.0
            for i, (dense, sparse, label) in enumerate(micro):
                last = i == len(micro) - 1
                with contextlib.nullcontext() if last else no_sync():
                    loss = nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), label)
                    (loss / len(micro)).backward()
                step_loss += float(loss.detach()) / len(micro)
            finish_gradient_sync(model)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            synchronize(*in_use)
            step_seconds.append(time.perf_counter() - start)
            losses.append(step_loss)
            samples += len(batch.label)
            bar.update(loss=step_loss)
    return {"step_loss": losses, "step_seconds": step_seconds, "samples": samples}


def _result(model: nn.Module, run: dict, seconds: float, eval_data) -> dict:
    module = getattr(model, "module", model)
    run.update(seconds=seconds, samples_per_s=run["samples"] / seconds if seconds > 0 else float("nan"),
               state={k: v.detach().cpu().clone() for k, v in module.state_dict().items()})
    if eval_data is not None:
        on_cpu = module if next(module.parameters()).device.type == "cpu" else copy.deepcopy(module).cpu()
        run.update(evaluate(on_cpu, eval_data))
    return run


def ddp_worker(kind: str, data, model_config: DLRMConfig, settings: TrainSettings,
               eval_data: ClickLogs | None = None, **wrap_options) -> dict:
    """Train on this rank as part of data parallel training; call it on every rank.

    Each rank builds its model with seed ``model_seed + rank`` (as if each process
    drew its own random weights); wrapping it broadcasts rank 0's, so every rank
    starts from ``model_seed``'s weights, like ``train_single``.
    Returns ``step_loss`` (the global batch's loss per step, averaged over ranks),
    ``step_seconds``, ``samples`` (global), ``seconds``, ``samples_per_s``, ``cpu_seconds``
    (this process's CPU time in the loop, all its threads),
    ``state`` (this rank's final state_dict), and on rank 0 ``auc``/``logloss`` on ``eval_data``.
    """
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), rank_device()
    model = wrap(model_config.build(seed=settings.model_seed + rank).to(device), kind, **wrap_options)
    per_rank = settings.per_rank_batch(world_size)
    dist.barrier()
    cpu_start = time.process_time()
    with Stopwatch(device) as wall:
        run = _loop(model, lambda e: rank_batches(data, rank, world_size, per_rank, e, settings.seed,
                                                  settings.set_epoch),
                    settings, desc=f"rank {rank}", live=False, device=device)
        cpu_seconds = time.process_time() - cpu_start
        dist.barrier()
    seconds = wall.seconds
    mean_loss = torch.tensor(run["step_loss"], dtype=torch.float64, device=device)
    dist.all_reduce(mean_loss)                       # one collective at the end, not one per step
    run["step_loss"] = (mean_loss / world_size).cpu().tolist()
    run["samples"] *= world_size
    run.update(rank=rank, world_size=world_size, kind=kind, cpu_seconds=cpu_seconds,
               collectives=getattr(model, "collectives_launched", None))
    return _result(model, run, seconds, eval_data if rank == 0 else None)


def train_single(data, model_config: DLRMConfig, settings: TrainSettings, world_size: int = 1,
                 eval_data: ClickLogs | None = None, desc: str = "single process", parallel=None,
                 device: torch.device | str | None = None) -> dict:
    """Train in this process on the global batches of ``world_size`` ranks (see ``global_batches``).

    ``world_size=1`` is plain single-process training. ``parallel``: a function that
    wraps the model (built on the CPU), e.g. in ``DataParallelByHand``, and puts it on
    its devices; the batches then go where its parameters are. Otherwise the model
    and batches live on ``device``, by default where rank 0 of ``world_size`` ranks
    would train (``devices(world_size)[0]``: ``cuda:0`` when every rank gets a GPU,
    else the CPU), so the twin runs on the device of the runs it is compared with.
    Same result keys as ``ddp_worker``; a live progress line shows in a notebook.
    """
    model = model_config.build(seed=settings.model_seed)
    if parallel is not None:
        model = parallel(model)
        device = next(model.parameters()).device
    else:
        device = torch.device(device) if device is not None else devices(world_size, quiet=True)[0]
        model = model.to(device)
    per_rank = settings.per_rank_batch(world_size)
    cpu_start = time.process_time()
    with Stopwatch(*getattr(model, "devices", [device])) as wall:
        run = _loop(model, lambda e: global_batches(data, world_size, per_rank, e, settings.seed,
                                                    settings.set_epoch),
                    settings, desc=desc, live=True, device=device)
    run.update(rank=0, world_size=1, kind="single", cpu_seconds=time.process_time() - cpu_start)
    return _result(model, run, wall.seconds, eval_data)


def max_difference(state_a: dict, state_b: dict) -> float:
    """Largest ``|a - b|`` over all entries of two state_dicts with the same keys and shapes."""
    if state_a.keys() != state_b.keys():
        raise ValueError(f"the state_dicts differ in keys: {sorted(set(state_a) ^ set(state_b))[:5]}")
    return max(float((state_a[k].double() - state_b[k].double()).abs().max()) for k in state_a)
