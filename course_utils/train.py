"""A small single-process training loop: ``train_step``, ``evaluate``, ``train``.

Later chapters reuse the pieces: a data-parallel rank calls ``train_step`` on
its share of the batch; ``evaluate`` scores any model that maps
``(dense, sparse) -> logit``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .data import Batch, ClickLogs
from .metrics import Timer, scores

__all__ = ["make_optimizer", "train_step", "predict", "evaluate", "train", "History"]


def make_optimizer(model: nn.Module, name: str = "adam", lr: float = 1e-3) -> torch.optim.Optimizer:
    """``"sgd"``, ``"sgd_momentum"`` (0.9), ``"adagrad"``, ``"adam"`` or ``"adamw"`` over all parameters."""
    params = list(model.parameters())
    makers = {
        "sgd": lambda: torch.optim.SGD(params, lr=lr),
        "sgd_momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=lr),
        "adam": lambda: torch.optim.Adam(params, lr=lr),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr),
    }
    if name not in makers:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(makers)} "
                         "or pass a torch.optim.Optimizer you built yourself.")
    return makers[name]()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch) -> float:
    """One step of binary cross-entropy on logits; returns the batch's mean loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.binary_cross_entropy_with_logits(model(batch.dense, batch.sparse), batch.label)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def predict(model: nn.Module, data: ClickLogs, batch_size: int = 8192) -> np.ndarray:
    """Click probabilities ``[N]`` float64 (the model is put in eval mode, then restored)."""
    was_training = model.training
    model.eval()
    try:
        probs = [torch.sigmoid(model(b.dense, b.sparse)).double().cpu().numpy()
                 for b in data.batches(batch_size)]
    finally:
        model.train(was_training)
    return np.concatenate(probs) if probs else np.zeros(0)


def evaluate(model: nn.Module, data: ClickLogs, batch_size: int = 8192) -> dict:
    """``{"auc": .., "logloss": ..}`` of the model's predictions on ``data``."""
    probs = predict(model, data, batch_size)
    return scores(data.label, probs)


@dataclass
class History:
    """What a training run did. ``step_loss`` has one entry per step; ``epochs``
    one dict per epoch: ``epoch, train_loss`` and, with eval data, ``auc, logloss``.
    ``seconds`` and ``samples_per_s`` are wall-clock (they vary run to run)."""
    step_loss: list = field(default_factory=list)
    epochs: list = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0

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


def train(model: nn.Module, data: ClickLogs, *, epochs: int = 1, batch_size: int = 1024,
          lr: float = 1e-3, optimizer: str | torch.optim.Optimizer = "adam", seed: int = 0,
          eval_data: ClickLogs | None = None, verbose: bool = False) -> History:
    """Train ``model`` on ``data`` with shuffled mini-batches; evaluate after each epoch.

    Deterministic given ``seed`` (and the model's own initial weights): epoch
    ``e`` shuffles with seed ``seed + e``. Prints nothing unless ``verbose``
    (then one line per epoch, as in :meth:`History.summary`).
    Returns a :class:`History`.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}.")
    if len(data) == 0:
        raise ValueError("data has no rows to train on.")
    opt = make_optimizer(model, optimizer, lr) if isinstance(optimizer, str) else optimizer
    history = History()
    model.train()
    for epoch in range(epochs):
        with Timer() as timer:
            losses = [train_step(model, opt, batch)
                      for batch in data.batches(batch_size, shuffle=True, seed=seed + epoch)]
        history.seconds += timer.seconds
        history.samples += len(data)
        history.step_loss += losses
        record = {"epoch": epoch + 1, "train_loss": float(np.mean(losses))}
        if eval_data is not None:
            record.update(evaluate(model, eval_data))
        history.epochs.append(record)
        if verbose:
            print(history.summary().splitlines()[-1], flush=True)
    return history
