"""Embedding tables with sparse gradients under DDP: the safe route, and what it sends.

An ``nn.EmbeddingBag(N, D)`` gets a dense ``[N, D]`` gradient each step, almost all zeros, and
DDP all-reduces all of it: ``4 N D`` bytes a step whatever the batch touched. Built with
``sparse=True`` its gradient is a sparse COO tensor, one row per lookup
(``course_utils.workload.sparse_optim``, appendix 07f, section 1). What the backends do with it:

* **NCCL** has no sparse all-reduce: "NCCL does not support all_reduce with sparse tensors"
  (``ProcessGroupNCCL``). On GPUs a sparse gradient goes through a gloo group, on the CPU.
* **gloo** has one (it all-gathers every rank's indices and values and adds them), and DDP uses
  it when a sparse gradient arrives. But DDP starts it in one of gloo's worker threads while the
  backward pass goes on, beside the dense bucket's all-reduce in the other, and on torch 2.13
  (CPU, 2 cores) that overlap now and then crashed: a rank died with SIGSEGV or SIGABRT in
  ``malloc`` called from ``AsyncSparseAllreduceWork``, a sign of a corrupted heap, in 2 of 20
  launches of 2000 steps (``benchmarks/sparse_ddp_overlap.py``, which measures it on your torch).

The safe route: DDP averages the dense layers only (``compat.ddp_ignore`` takes the table out of
DDP), and the table's sparse gradient is averaged once ``backward()`` has returned, with nothing
else running (``average_sparse_gradient``: one blocking ``all_reduce`` of the sparse tensor,
then a division by the world size); 0 of 50 launches failed. The other safe route is a dense
table: DDP all-reduces its ``[N, D]`` gradient like any other.

``sparse_or_dense`` trains the same table (``BigTableModel``) both ways and returns the weights and
the bytes. Chapter 08's big-table run (``course_utils.checkpoint.background``) trains it the safe way.

Taught in chapter 04 (appendix 04a, section 4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course_utils.runtime import compat
from course_utils.workload.sparse_optim import tensor_bytes

__all__ = ["BigTableModel", "average_sparse_gradient", "sparse_or_dense"]


class BigTableModel(torch.nn.Module):
    """A click model whose state is large and whose step is cheap: a sum-pooled embedding
    table ``[rows, dim]`` with sparse gradients, then a linear layer. ``forward(ids [B, L]) -> [B]``."""

    def __init__(self, rows: int, dim: int = 64, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        self.head = torch.nn.Linear(dim, 1)
        with torch.no_grad():
            self.table.weight.copy_(torch.randn(rows, dim, generator=generator) * 0.01)
            self.head.weight.copy_(torch.randn(1, dim, generator=generator) * 0.1)
            self.head.bias.zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids)).squeeze(1)


def average_sparse_gradient(parameter: torch.nn.Parameter) -> None:
    """Replace ``parameter.grad`` (sparse COO, ``[rows, dim]`` with ``nnz`` looked-up rows) by its
    mean over the ranks of the default group: one ``dist.all_reduce`` of the sparse tensor (gloo
    all-gathers every rank's indices and values and adds them), waited for here.

    Why not leave it to DDP, which all-reduces sparse gradients too: its overlapped sparse
    all-reduce crashed ranks on gloo (the module's docstring says how often).
    """
    grad = parameter.grad
    if grad is None or not grad.is_sparse:
        raise ValueError(
            "average_sparse_gradient expects a parameter with a sparse gradient (call it after backward, "
            "on an embedding built with sparse=True)"
        )
    # NCCL has no sparse all-reduce ("only available in the NCCL experimental branch"): a GPU's
    # sparse gradient goes through the group's gloo half, on the CPU, and back
    summed = grad.cpu()  # on the CPU: grad itself
    dist.all_reduce(summed)  # in place: summed now holds the sum over the ranks
    parameter.grad = summed.div_(dist.get_world_size()).to(grad.device)


def sparse_or_dense(rows: int = 20_000, dim: int = 16, batch: int = 64, bag: int = 4, steps: int = 5) -> dict:
    """On every rank (call through ``launch``): ``steps`` SGD steps of ``BigTableModel(rows, dim)``
    on this rank's ``[batch, bag]`` id bags, two ways:

    * ``"dense"``: the table without ``sparse=True``; DDP all-reduces its ``[rows, dim]`` gradient;
    * ``"sparse, averaged after backward"``: ``sparse=True``, the table left out of DDP, its gradient
      averaged by ``average_sparse_gradient`` after ``backward()``.

    Returns ``{way: {"weights": this rank's table [rows, dim], "table gradient bytes": this rank's,
    at the last step (sparse: indices and values, before the average)}}``.
    """
    generator = torch.Generator().manual_seed(dist.get_rank())
    ids = [torch.randint(rows, (batch, bag), generator=generator) for _ in range(steps)]
    out = {}
    for way in ("dense", "sparse, averaged after backward"):
        module = BigTableModel(rows, dim, seed=0)
        sparse = way != "dense"
        module.table.sparse = sparse  # EmbeddingBag reads it at every forward
        if sparse:
            compat.ddp_ignore(module, ["table.weight"])  # DDP averages the head only
        model = DistributedDataParallel(module)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for step_ids in ids:
            optimizer.zero_grad(set_to_none=True)
            model(step_ids).square().mean().backward()
            sent = tensor_bytes(module.table.weight.grad)
            if sparse:
                average_sparse_gradient(module.table.weight)  # after backward, nothing else running
            optimizer.step()
        out[way] = {"weights": module.table.weight.detach().clone(), "table gradient bytes": sent}
    return out
