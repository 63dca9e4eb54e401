"""Training: the loss, one step, and the one loop every chapter trains with.

``bce_loss`` and ``train_step`` are chapter 01's idea in a few lines. ``fit`` is the
loop (taught in chapter 04) that single-process training (``train``), data parallel
training (``course_utils.ddp``: by hand and torch DDP, and their one-process twin) and
hybrid training (``course_utils.sharding.hybrid``) all run, so they all return a ``History``::

    for each epoch:  batches.set_epoch(epoch)             # a new order every epoch
        for each batch:                                   # train_step:
            loss = bce_loss(model, batch)                 #   (in micro-batches, to accumulate)
            loss.backward(); finish_gradient_sync(model)  #   DDP by hand averages gradients here
            optimizer.step()
        [over ranks: average the epoch's step losses]; evaluate

Taught in chapters 01 (the step) and 04 (one loop for every variant).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from course_utils.notebook.progress import Progress
from course_utils.runtime.checks import check_choice, check_whole
from course_utils.runtime.timing import Stopwatch
from course_utils.workload.data import Batch, ClickLogs
from course_utils.workload.data.loaders import InMemoryBatches
from course_utils.workload.metrics import scores
from course_utils.workload.models import OPTIMIZERS

__all__ = [
    "make_optimizer",
    "bce_loss",
    "train_step",
    "finish_gradient_sync",
    "predict",
    "evaluate",
    "History",
    "fit",
    "train",
]


def make_optimizer(model: nn.Module, name: str = "adam", lr: float = 1e-3) -> torch.optim.Optimizer:
    """``"sgd"``, ``"sgd_momentum"`` (0.9), ``"adagrad"``, ``"adam"`` or ``"adamw"`` over all parameters
    (the table ``models.OPTIMIZERS``)."""
    check_choice("optimizer", name, OPTIMIZERS, hint=" or pass a torch.optim.Optimizer you built yourself.")
    kind, options, _ = OPTIMIZERS[name]
    return kind(model.parameters(), lr=lr, **options)


def bce_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The loss of the course: binary cross-entropy of the model's click logits, mean over the rows."""
    return nn.functional.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.label)


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, accumulation_steps: int = 1
) -> float:
    """One step of gradient descent on the batch's mean loss; returns that loss.

    With ``accumulation_steps`` k, the batch is cut into k micro-batches whose gradients add
    up (each loss divided by k): the same step, in less memory. Data parallel training
    (chapter 04) adds two calls that do nothing in one process: ``model.no_sync()`` keeps the
    micro-batches' gradients local, and ``finish_gradient_sync`` averages them over the ranks.
    """
    optimizer.zero_grad(set_to_none=True)
    micro = list(zip(*(t.chunk(accumulation_steps) for t in batch), strict=False))
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    step_loss = 0.0
    for i, part in enumerate(micro):
        with contextlib.nullcontext() if i == len(micro) - 1 else no_sync():
            loss = bce_loss(model, Batch(*part))
            (loss / len(micro)).backward()
        step_loss += float(loss.detach()) / len(micro)
    finish_gradient_sync(model)
    optimizer.step()
    return step_loss


def finish_gradient_sync(model: nn.Module) -> None:
    """The by-hand DDPs average gradients here; torch DDP already did, inside backward."""
    finish = getattr(model, "finish_gradient_sync", None)
    if finish is not None:
        finish()


@torch.no_grad()
def predict(model: nn.Module, data: ClickLogs, batch_size: int = 8192) -> np.ndarray:
    """Click probabilities ``[N]`` float64 (the model is put in eval mode, then restored)."""
    was_training = model.training
    model.eval()
    try:
        probs = [
            torch.sigmoid(model(b.dense, b.sparse)).double().cpu().numpy() for b in data.batches(batch_size)
        ]
    finally:
        model.train(was_training)
    return np.concatenate(probs) if probs else np.zeros(0)


def evaluate(model: nn.Module, data: ClickLogs, batch_size: int = 8192) -> dict:
    """``{"auc": .., "logloss": ..}`` of the model's predictions on ``data``."""
    probs = predict(model, data, batch_size)
    return scores(data.label, probs)


@dataclass
class History:
    """What a training run did, whichever way it trained.

    step_loss: one entry per step, the global batch's mean loss (on several ranks: averaged over them).
    step_seconds: one per step, the step's wall time (devices synchronised; data loading not included).
    step_cpu_seconds: one per step, this process's CPU time in the same span (all its threads): with
        one thread, the time the step had the core, whatever other programs took meanwhile.
    epochs: one dict per epoch: ``epoch, train_loss`` and, with evaluation data, ``auc, logloss``.
    samples: rows trained on, all ranks together. seconds: wall time of the epochs' training,
    data loading included, evaluation not. cpu_seconds: this process's CPU time in them.
    kind, rank, world_size: who trained: ``"single"`` (one process), ``"naive"``, ``"bucketed"``,
    ``"torch"`` (the DDPs) or ``"hybrid"``.
    collectives: all-reduces a by-hand DDP started (else None). state: the final weights (CPU copies),
    where the caller keeps them (DDP runs do). Times vary run to run; the rest is deterministic.
    """

    step_loss: list = field(default_factory=list)
    step_seconds: list = field(default_factory=list, repr=False)
    step_cpu_seconds: list = field(default_factory=list, repr=False)
    epochs: list = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    kind: str = "single"
    rank: int = 0
    world_size: int = 1
    collectives: int | None = None
    state: dict | None = field(default=None, repr=False)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @property
    def final(self) -> dict:
        """The last epoch's record."""
        return self.epochs[-1] if self.epochs else {}

    def summary(self, digits: int = 3) -> str:
        """One deterministic line per epoch (no timings), e.g. for a notebook."""
        lines = []
        for rec in self.epochs:
            parts = [f"epoch {rec['epoch']}", f"train loss {rec['train_loss']:.{digits}f}"]
            parts += [f"{k} {rec[k]:.{digits}f}" for k in ("auc", "logloss") if k in rec]
            lines.append(" | ".join(parts))
        return "\n".join(lines)


def _mean_over_ranks(values: list, device: torch.device) -> list:
    """Element-wise mean over the ranks of a list of floats: one all_reduce."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return (total / dist.get_world_size()).cpu().tolist()


def fit(
    model: nn.Module,
    batches,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int = 1,
    max_steps: int | None = None,
    accumulation_steps: int = 1,
    warmup_steps: int = 0,
    set_epoch: bool = True,
    distributed: bool = False,
    score: Callable[[], dict] | None = None,
    after_step: Callable[[int], None] | None = None,
    device: torch.device | None = None,
    desc: str = "",
    live: bool = False,
    verbose: bool = False,
) -> History:
    """Train ``model`` on ``batches`` for ``epochs`` epochs (at most ``max_steps`` steps); return a History.

    batches: a loader (``course_utils.workload.data.loaders``): ``len()`` steps per epoch, iterated once per
        epoch, after ``batches.set_epoch(epoch)`` unless ``set_epoch=False`` (then every epoch
        repeats epoch 0's order, as with a ``DistributedSampler`` nobody told the epoch).
    accumulation_steps: micro-batches per step; all but the last run under ``model.no_sync()``.
    warmup_steps: the learning rate climbs linearly from lr/warmup_steps to lr.
    distributed: every rank runs this loop on its share of each global batch; the step losses
        are averaged over the ranks at the end of each epoch (one all_reduce) and ``samples``
        counts every rank's rows. score: called after each epoch; its dict joins the epoch's record.
    after_step: called with the number of steps done. device: where batches go (default: the
        model's first parameter's). desc, live: the progress line (shown only if ``live``).
    """
    device = device if device is not None else next(model.parameters()).device
    in_use = getattr(model, "devices", [device])  # DataParallelByHand works on several
    world = dist.get_world_size() if distributed else 1
    warm = max(warmup_steps, 1)
    scheduler = (
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warm))
        if warmup_steps > 0
        else None
    )
    total = epochs * len(batches) if max_steps is None else min(epochs * len(batches), max_steps)
    history, done = History(world_size=world), 0
    model.train()
    cpu_start = time.process_time()
    with Progress(total, desc, mode=None if live else "nowhere") as bar:
        for epoch in range(epochs):
            if done == total:
                break
            if set_epoch:
                batches.set_epoch(epoch)
            losses = []
            with Stopwatch(*in_use) as wall:  # the epoch, data loading included
                for batch in batches:
                    with Stopwatch(*in_use) as step:  # the step alone (GPUs: until their work is done)
                        batch = Batch(*(t.to(device) for t in batch))
                        losses.append(train_step(model, optimizer, batch, accumulation_steps))
                        if scheduler is not None:
                            scheduler.step()
                    history.step_seconds.append(step.seconds)
                    history.step_cpu_seconds.append(step.cpu_seconds)
                    history.samples += len(batch.label) * world
                    done += 1
                    bar.update(loss=losses[-1])
                    if after_step is not None:
                        after_step(done)
                    if done == total:
                        break
                if distributed:  # one collective per epoch, not one per step
                    losses = _mean_over_ranks(losses, device)
            history.seconds += wall.seconds
            history.step_loss += losses
            record = {"epoch": epoch + 1, "train_loss": float(np.mean(losses))}
            history.epochs.append({**record, **(score() if score is not None else {})})
            if verbose:
                print(history.summary().splitlines()[-1], flush=True)
    history.cpu_seconds = time.process_time() - cpu_start
    return history


def train(
    model: nn.Module,
    data: ClickLogs,
    *,
    epochs: int = 1,
    batch_size: int = 1024,
    lr: float = 1e-3,
    optimizer: str | torch.optim.Optimizer = "adam",
    seed: int = 0,
    eval_data: ClickLogs | None = None,
    verbose: bool = False,
) -> History:
    """Train ``model`` on ``data`` with shuffled mini-batches; evaluate after each epoch.

    Deterministic given ``seed`` (and the model's own initial weights): epoch
    ``e`` shuffles with seed ``seed + e``. Prints nothing unless ``verbose``
    (then one line per epoch, as in :meth:`History.summary`).
    Returns a :class:`History`.
    """
    check_whole("epochs", epochs)
    if len(data) == 0:
        raise ValueError("data has no rows to train on.")
    opt = make_optimizer(model, optimizer, lr) if isinstance(optimizer, str) else optimizer
    return fit(
        model,
        InMemoryBatches(data, batch_size, seed=seed),
        opt,
        epochs=epochs,
        verbose=verbose,
        score=None if eval_data is None else lambda: evaluate(model, eval_data),
    )
