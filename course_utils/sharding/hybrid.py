"""The hybrid DLRM: model-parallel embedding tables, data-parallel (DDP) dense layers.

    every rank: its own rows of the global batch  dense [B, 13], sparse [B, T]
        sparse --sharded lookup (all-to-all out and back)--> embedded [B, T, D]
        dense, embedded --DDP(bottom MLP, interaction, top MLP)--> logit [B]

The tables are split over the ranks (``course_utils.sharding``): each rank holds
``1/W`` of them, and the ids and pooled vectors travel. The MLPs are small, so every
rank holds a copy, wrapped in ``DistributedDataParallel``, which averages their
gradients over the ranks. The embedding gradients arrive *summed* over the ranks
through the reverse all-to-all; a hook divides them by ``W`` so that both parts get
the gradient of the mean loss over the global batch: exactly what single-process
training computes, so the two train the same model.

Taught in chapter 07.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils import sharding
from course_utils.ddp import settle_ddp_buckets
from course_utils.runtime.hardware import rank_device
from course_utils.workload.data import Batch, ClickLogs
from course_utils.workload.data.loaders import InMemoryBatches, MapBatches
from course_utils.workload.global_auc import gather_predictions
from course_utils.workload.metrics import scores
from course_utils.workload.models import DLRM, DLRMConfig
from course_utils.workload.train import History, fit, make_optimizer, predict

__all__ = ["DenseArch", "HybridDLRM", "local_rows", "train_hybrid", "evaluate_hybrid", "predict_own_rows"]


class DenseArch(nn.Module):
    """A DLRM without its tables: ``forward(dense [B, n_dense], embedded [B, T, D]) -> logit [B]``.

    Copies of the DLRM's own parts: ``bottom`` (MLP), ``interaction`` (``DotInteraction``) and
    ``top`` (MLP), so its parameters are named as in the DLRM (``bottom.0.weight``, ...).
    """

    def __init__(self, model: DLRM):
        super().__init__()
        self.bottom, self.interaction, self.top = (
            copy.deepcopy(part) for part in (model.bottom, model.interaction, model.top)
        )

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        return self.top(self.interaction(self.bottom(dense), embedded)).squeeze(1)


def _dense_source(model_or_config, seed: int) -> DLRM:
    """The DLRM whose MLPs the ranks copy: the model itself, or (for a config) a DLRM of
    the same shape with one-row tables, so that no rank allocates the real tables."""
    if isinstance(model_or_config, DLRM):
        return model_or_config
    if isinstance(model_or_config, DLRMConfig):
        return dataclasses.replace(model_or_config, cardinalities=(1,) * model_or_config.n_tables).build(
            seed=seed
        )
    raise TypeError(f"expected a DLRM or a DLRMConfig, got {type(model_or_config).__name__}")


class HybridDLRM(nn.Module):
    """A DLRM trained by ``W`` ranks: sharded tables + DDP-replicated MLPs. Build it in every rank.

    model_or_config: a :class:`DLRM` (each rank copies its shards and the MLPs from it:
        the same start as single-process training), or a :class:`DLRMConfig` (shards
        initialised on each rank, no rank ever holds a whole table).
    kind: ``"table_wise"``, ``"row_wise"`` or ``"column_wise"``; ``split``: row-wise ``"range"``/``"hash"``.
    budget: a ``sharding.MemoryBudget`` checked before the tables are allocated.
    average_embedding_gradients: divide the embedding gradients by ``W`` (the default, and the
        right thing); ``False`` leaves them summed over the ranks, the mistake chapter 07 shows.
    ``forward(dense [B, n_dense], sparse [B, T]) -> logit [B]`` on this rank's rows (computed on
    ``rank_device()``, returned on the input's device).
    """

    def __init__(
        self,
        model_or_config,
        kind: str = "row_wise",
        *,
        split: str = "range",
        seed: int = 0,
        budget: sharding.MemoryBudget | None = None,
        average_embedding_gradients: bool = True,
    ):
        super().__init__()
        self.average_embedding_gradients = average_embedding_gradients
        source = _dense_source(model_or_config, seed)
        config = model_or_config.config if isinstance(model_or_config, DLRM) else model_or_config
        self.world_size = dist.get_world_size()
        options = {"split": split} if kind == "row_wise" else {}
        self.plan = sharding.make_plan(
            kind, config.cardinalities, config.embedding_dim, self.world_size, **options
        )
        dense = DenseArch(source)
        self.embeddings = sharding.shard_embeddings(
            self.plan,
            model_or_config if isinstance(model_or_config, DLRM) else None,
            seed=seed,
            budget=budget,
            extra_values=sum(p.numel() for p in dense.parameters()),
        )
        device = rank_device()
        self.dense = DDP(
            dense.to(device),
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
        c = self.plan  # same buckets in a fresh run and a resumed one (see settle_ddp_buckets)
        settle_ddp_buckets(
            self.dense,
            torch.zeros(1, config.n_dense, device=device),
            torch.zeros(1, c.n_tables, c.dim, device=device),
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        device = rank_device()
        embedded = self.embeddings(sparse.to(device))
        # summed over ranks on the way back: make it the mean, like DDP
        if embedded.requires_grad and self.average_embedding_gradients:
            embedded.register_hook(lambda grad: grad / self.world_size)
        return self.dense(dense.to(device), embedded).to(dense.device)  # logits where the input was

    def checkpoint_entries(self) -> list:
        """``[(name, parameter, place)]``: what a sharded checkpoint saves of this model
        (``course_utils.checkpoint.sharded``): each table shard placed in its whole table, and the
        dense layers (replicated, ``place`` None)."""
        from course_utils.sharding.dtensor import checkpoint_entries

        return checkpoint_entries(self.embeddings, "embeddings") + [
            (f"dense.{name}", p, None) for name, p in self.dense.module.named_parameters()
        ]


def local_rows(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s equal, contiguous share of a global batch (``B`` must divide by ``W``)."""
    n = len(batch.label)
    if n % world_size:
        raise ValueError(
            f"a batch of {n} rows cannot be split equally over {world_size} ranks; "
            f"use a batch size and a data size that are multiples of {world_size}"
        )
    rows = slice(rank * n // world_size, (rank + 1) * n // world_size)
    return Batch(batch.dense[rows], batch.sparse[rows], batch.label[rows])


def predict_own_rows(model: HybridDLRM, logs: ClickLogs, batch_size: int = 8192) -> np.ndarray:
    """Click probabilities ``[n_r]`` of this rank's own rows ``logs`` (``n_r`` may differ between
    ranks, as row groups do). The sharded lookups need one batch size on every rank, so each
    rank pads its rows to the longest share (repeating its last row) and drops the padding's
    predictions. Every rank calls it."""
    sizes = torch.tensor([len(logs), -len(logs)], device=rank_device())
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX)  # the longest share, and minus the shortest
    longest, shortest = int(sizes[0]), -int(sizes[1])
    if shortest == 0:  # every rank knows, so every rank refuses (none waits for the others)
        raise ValueError("a rank has no rows to predict; give every rank at least one row group")
    padded = logs[np.r_[np.arange(len(logs)), np.full(longest - len(logs), len(logs) - 1)]]
    return predict(model, padded, batch_size)[: len(logs)]


def evaluate_hybrid(model: HybridDLRM, data: ClickLogs, batch_size: int = 8192) -> dict:
    """AUC and logloss over all of ``data``: each rank predicts its contiguous share, then
    the predictions are gathered (every rank returns the same numbers). ``len(data)``
    must divide by ``W``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(data) % world:
        raise ValueError(
            f"{len(data)} evaluation rows cannot be split equally over {world} ranks; "
            f"use a multiple of {world}"
        )
    share = len(data) // world
    probs = predict_own_rows(model, data[rank * share : (rank + 1) * share], batch_size // world)
    labels, probs = gather_predictions(data.label[rank * share : (rank + 1) * share], probs)
    return scores(labels, probs)


def train_hybrid(
    model: HybridDLRM,
    data: ClickLogs,
    *,
    epochs: int = 1,
    batch_size: int = 1024,
    lr: float = 1e-3,
    optimizer: str | torch.optim.Optimizer = "adam",
    seed: int = 0,
    eval_data: ClickLogs | None = None,
    budget: sharding.MemoryBudget | None = None,
) -> History:
    """:func:`course_utils.workload.train.train`, on ``W`` ranks: the same global batches (``batch_size``
    rows, shuffled with ``seed + epoch``), each rank training on its share in the same loop
    (``train.fit``). Run it in every rank; every rank returns the same History (losses
    averaged over the ranks). ``optimizer``: a name for ``train.make_optimizer`` (with ``lr``) or
    an optimizer over ``model.parameters()``. With ``budget``, the memory a rank really holds is
    checked after the first step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(data) % batch_size % world:
        raise ValueError(
            f"the last batch ({len(data) % batch_size} rows) cannot be split equally over "
            f"{world} ranks; use a number of rows that is a multiple of {world}"
        )
    opt = make_optimizer(model, optimizer, lr) if isinstance(optimizer, str) else optimizer
    shares = MapBatches(InMemoryBatches(data, batch_size, seed), lambda batch: local_rows(batch, rank, world))

    def check_budget(steps: int) -> None:  # the memory really held, once the optimizer has its state
        if budget is not None and steps == 1:
            budget.enforce(model, opt)

    history = fit(
        model,
        shares,
        opt,
        epochs=epochs,
        distributed=True,
        after_step=check_budget,
        score=None if eval_data is None else lambda: evaluate_hybrid(model, eval_data),
    )
    history.kind, history.rank = "hybrid", rank
    return history
