"""Sharded data parallelism with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Every rank trains on its own rows, as with DDP, but holds only ``1/W`` of each parameter, of
its gradient and of Adam's state: ``fully_shard`` turns each parameter into a ``DTensor``
sharded on dim 0 over the ranks. Before a module's forward (and again before its backward) it
all-gathers that module's full parameters and frees them after; after backward it
reduce-scatters the gradients, so each rank keeps the averaged gradient of its shard only.
The optimizer then updates the shards it holds. This is ZeRO stage 3 (Rajbhandari et al. 2020).

* ``fsdp_train(model, batches, lr)``: run on every rank; Adam steps under ``fully_shard``;
* ``train_one_process(model, batches, lr)``: the same steps without sharding, the reference;
* ``bytes_held(model, optimizer)``: the bytes of this rank's parameters, gradients and
  optimizer state, counted from the local shards.

Taught in chapter 05 (section 7, sharded data parallelism).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["fsdp_train", "train_one_process", "bytes_held"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the local shard of a DTensor, else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _is_sharded(t: torch.Tensor) -> bool:
    return hasattr(t, "placements") and any(p.is_shard() for p in t.placements)


def bytes_held(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes this rank holds for ``model``'s parameters, their gradients and the optimizer's
    state, from each tensor's local shard (``DTensor.to_local()``); state tensors that are not
    sharded (Adam's ``step`` counter, a scalar per parameter) are counted apart."""
    params = list(model.parameters())
    held = {
        "parameters": sum(_local(p).nbytes for p in params),
        "gradients": sum(_local(p.grad).nbytes for p in params if p.grad is not None),
        "optimizer": 0,
        "not sharded": 0,
    }
    for state in optimizer.state.values():
        for t in state.values():
            if torch.is_tensor(t):
                held["optimizer" if _is_sharded(t) or t.dim() > 0 else "not sharded"] += _local(t).nbytes
    return held


def _adam_steps(model: nn.Module, batches, lr: float, rows=slice(None)) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    held = None
    for k, (x, y) in enumerate(batches):
        nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
        if k == len(batches) - 1:
            held = bytes_held(model, opt)  # after the last step, gradients still held
        opt.zero_grad()
    return held


def fsdp_train(model: nn.Sequential, batches: list, lr: float = 1e-3) -> dict:
    """Run on every rank: Adam on ``batches`` (a list of (x [B, in], y [B, out]), the same
    on every rank, B divisible by the world size; each rank takes its B/W rows) with
    ``fully_shard`` on each child of ``model`` that has parameters, then on the whole.

    Returns ``{"params": {name: full parameter after training, gathered}, "held": bytes_held
    after the last step, "numel": parameters in the model}``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from course_utils.runtime.hardware import rank_device

    rank, world = dist.get_rank(), dist.get_world_size()
    # details: a batch that does not split evenly is refused
    for x, _ in batches:
        if x.shape[0] % world:
            raise ValueError(
                f"a batch of {x.shape[0]} rows does not split evenly over {world} ranks: "
                f"use a batch size that is a multiple of {world}"
            )
    # end details
    device = rank_device()  # this rank's GPU under NCCL, else the CPU
    model = copy.deepcopy(model).to(device)
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    numel = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh(device.type, (world,))
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)  # one all-gather per child: one child's full weights at a time
    fully_shard(model, mesh=mesh)
    rows = batches[0][0].shape[0] // world
    held = _adam_steps(model, batches, lr, slice(rank * rows, (rank + 1) * rows))
    return {
        "params": {name: p.full_tensor().cpu() for name, p in model.named_parameters()},
        "held": held,
        "numel": numel,
    }


def train_one_process(model: nn.Module, batches: list, lr: float = 1e-3) -> dict:
    """The same Adam steps as ``fsdp_train`` on one process, whole batches, nothing sharded.
    Returns ``{"params": {name: parameter after training}, "held": bytes_held}``."""
    model = copy.deepcopy(model)
    held = _adam_steps(model, batches, lr)
    return {"params": {name: p.detach().clone() for name, p in model.named_parameters()}, "held": held}
