"""Sparse embedding gradients in plain PyTorch: the middle ground between dense Adam and a fused optimizer.

An ``nn.EmbeddingBag(N, D)`` built without ``sparse=True`` gets a dense gradient ``[N, D]`` at
every step, almost all of it zeros. With ``sparse=True`` autograd leaves a sparse COO tensor
instead: ``indices [1, nnz]`` int64 and ``values [nnz, D]`` float32, one row per *lookup* of the
batch (an id looked up twice appears twice; ``grad.coalesce()`` adds the duplicates, leaving one
row per distinct id). Only some optimizers accept that:

* ``"adam"``: the baseline. Dense tables, ``torch.optim.Adam`` over every parameter.
* ``"sparse_adam"``: sparse tables with ``torch.optim.SparseAdam`` (it takes sparse gradients
  only), the MLPs with ``torch.optim.Adam``. SparseAdam is *lazy* Adam: it updates the two moments,
  and the weights, of the rows present in the gradient only. Dense Adam keeps moving a row that
  was seen before (its first moment decays but is not zero), so the two are different algorithms.
* ``"adagrad"``: sparse tables with ``torch.optim.Adagrad`` (which accepts sparse gradients), the
  MLPs with Adam, as production recommenders pair a table optimizer with a dense one. Adagrad's
  update of a row whose gradient is zero is zero and its running sum does not change, so sparse
  Adagrad computes the same numbers as dense Adagrad, only without touching the other rows.

Both keep their state dense: SparseAdam two ``[N, D]`` moments (as much as Adam), Adagrad one
``[N, D]`` running sum. What the sparse gradient saves is the gradient itself and the work on the
rows a batch did not use. In a distributed run a sparse gradient is averaged over the ranks
after backward (``course_utils.ddp.sparse_tables.average_sparse_gradient``, appendix 04a).

Taught in chapter 07 (appendix 07f, section 1: sparse gradients with SparseAdam and Adagrad).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_utils.runtime import compat
from course_utils.runtime.checks import check_choice
from course_utils.workload.data import Batch, ClickLogs
from course_utils.workload.models import DLRM
from course_utils.workload.train import History, bce_loss, train

__all__ = [
    "SPARSE_CHOICES",
    "Optimizers",
    "make_optimizers",
    "tensor_bytes",
    "gradient_bytes",
    "state_bytes",
    "sparse_gradient_formula",
    "SparseRun",
    "train_with",
]

#: name -> whether its tables need sparse gradients (``DLRM(..., sparse_gradients=True)``).
SPARSE_CHOICES = {"adam": False, "sparse_adam": True, "adagrad": True}


class Optimizers:
    """Several optimizers stepped as one (what ``train.fit`` calls: ``zero_grad`` and ``step``).

    ``optimizers``: each over its own parameters, e.g. SparseAdam over the tables and Adam over
    the MLPs. ``step`` runs with sparse-tensor invariant checks explicitly off: torch's sparse
    Adagrad builds its sparse update with ``torch.sparse_coo_tensor`` and, from torch 2.11 on,
    warns when nobody said whether to check them.
    """

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            for optimizer in self.optimizers:
                optimizer.step()

    @property
    def param_groups(self) -> list:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def __repr__(self) -> str:
        return " + ".join(type(o).__name__ for o in self.optimizers)


def make_optimizers(model: DLRM, name: str, lr: float, table_lr: float | None = None) -> Optimizers:
    """``"adam"``, ``"sparse_adam"`` or ``"adagrad"`` (module docstring) over a DLRM's parameters:
    ``lr`` for Adam and SparseAdam, ``table_lr`` (default ``lr``) for Adagrad's tables.

    The model's tables must match: sparse gradients for ``"sparse_adam"`` and ``"adagrad"``,
    dense ones for ``"adam"`` (torch's Adam refuses sparse gradients).
    """
    check_choice("optimizer", name, SPARSE_CHOICES)
    sparse = all(bag.sparse for bag in model.embeddings)
    if sparse != SPARSE_CHOICES[name]:
        build = "sparse_gradients=True" if SPARSE_CHOICES[name] else "sparse_gradients=False (the default)"
        raise ValueError(f"optimizer {name!r} needs a DLRM built with {build}")
    if name == "adam":
        return Optimizers(torch.optim.Adam(model.parameters(), lr=lr))
    if name == "sparse_adam":
        return Optimizers(
            torch.optim.SparseAdam(list(model.embedding_parameters()), lr=lr),
            torch.optim.Adam(model.dense_parameters(), lr=lr),
        )
    return Optimizers(
        torch.optim.Adagrad(list(model.embedding_parameters()), lr=table_lr or lr),
        torch.optim.Adam(model.dense_parameters(), lr=lr),
    )


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor's data occupies: ``numel * element_size``; a sparse COO tensor's indices
    (``[ndim_sparse, nnz]`` int64) plus its values (``[nnz, D]``)."""
    if t.is_sparse:
        indices, values = compat.sparse_indices_and_values(t)
        return tensor_bytes(indices) + tensor_bytes(values)
    return t.numel() * t.element_size()


def gradient_bytes(parameters, coalesce: bool = False) -> int:
    """Bytes of the ``.grad`` tensors of ``parameters`` (those with none count 0); with
    ``coalesce``, a sparse gradient is counted after ``coalesce()`` (one row per distinct id)."""
    total = 0
    for p in parameters:
        if p.grad is not None:
            total += tensor_bytes(p.grad.coalesce() if coalesce and p.grad.is_sparse else p.grad)
    return total


def state_bytes(optimizer) -> int:
    """Bytes of every tensor an optimizer (or ``Optimizers``) keeps in its ``state``: moments,
    running sums and step counters (a 0-d float32 tensor in Adam and Adagrad, a Python int in
    SparseAdam, which counts 0)."""
    optimizers = getattr(optimizer, "optimizers", (optimizer,))
    return sum(
        tensor_bytes(v)
        for o in optimizers
        for state in o.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def sparse_gradient_formula(lookups: int, dim: int, distinct: int | None = None) -> int:
    """Bytes of one table's sparse gradient: ``lookups`` rows as autograd leaves it, each an
    8-byte index and ``dim`` 4-byte values; ``distinct`` rows once coalesced."""
    rows = lookups if distinct is None else distinct
    return rows * (8 + 4 * dim)


@dataclass
class SparseRun:
    """One model trained with one choice (``train_with``).

    name: the choice. history: ``train.train``'s ``History`` (final test AUC in ``history.final``).
    weight_bytes: the tables' and MLPs' weights. state_bytes: the optimizers' state after training.
    table_gradient_bytes, dense_gradient_bytes: the gradients one training step leaves, on
    ``probe`` (``[B]`` rows); table_gradient_coalesced: the tables' after ``coalesce()``.
    """

    name: str
    history: History
    weight_bytes: int
    state_bytes: int
    table_gradient_bytes: int
    table_gradient_coalesced: int
    dense_gradient_bytes: int


def _step_gradients(model: DLRM, batch: Batch) -> tuple[int, int, int]:
    """(tables' gradient bytes, coalesced, MLPs' gradient bytes) after one backward on ``batch``."""
    model.zero_grad(set_to_none=True)
    bce_loss(model, batch).backward()
    tables = list(model.embedding_parameters())
    out = (
        gradient_bytes(tables),
        gradient_bytes(tables, coalesce=True),
        gradient_bytes(model.dense_parameters()),
    )
    model.zero_grad(set_to_none=True)
    return out


def train_with(
    name: str,
    train_data: ClickLogs,
    test_data: ClickLogs,
    *,
    lr: float,
    table_lr: float | None = None,
    batch_size: int = 2048,
    embedding_dim: int = 16,
    seed: int = 0,
) -> SparseRun:
    """Train a fresh ``DLRM(train_data.cardinalities, seed=seed)`` for one epoch with ``name``'s
    optimizers (``make_optimizers``: ``lr`` for Adam, ``table_lr`` for Adagrad's tables), evaluate
    it on ``test_data`` and measure its bytes.

    The gradient bytes are those of one step on the first ``batch_size`` rows of ``train_data``
    (``dense [B, 13]``, ``sparse [B, T]``): ``T * B`` lookups, ``T`` sparse gradients.
    """
    check_choice("optimizer", name, SPARSE_CHOICES)
    model = DLRM(
        train_data.cardinalities,
        embedding_dim=embedding_dim,
        seed=seed,
        sparse_gradients=SPARSE_CHOICES[name],
    )
    optimizers = make_optimizers(model, name, lr, table_lr)
    history = train(
        model, train_data, batch_size=batch_size, optimizer=optimizers, seed=seed, eval_data=test_data
    )
    probe = next(iter(train_data[:batch_size].batches(batch_size)))
    tables, coalesced, dense = _step_gradients(model, probe)
    return SparseRun(
        name=name,
        history=history,
        weight_bytes=sum(tensor_bytes(p) for p in model.parameters()),
        state_bytes=state_bytes(optimizers),
        table_gradient_bytes=tables,
        table_gradient_coalesced=coalesced,
        dense_gradient_bytes=dense,
    )
