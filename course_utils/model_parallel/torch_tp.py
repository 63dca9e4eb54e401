"""PyTorch's own tensor parallelism (``torch.distributed.tensor.parallel``) next to the course's.

``parallelize_module(model, mesh, plan)`` replaces each planned ``nn.Linear``'s weight and bias
by ``DTensor``s sharded over a ``DeviceMesh``: ``ColwiseParallel`` shards the weight by rows
(output features, ``Shard(0)``), like ``ColumnParallelLinear(gather_output=False)``;
``RowwiseParallel`` by columns (input features, ``Shard(1)``) with the bias replicated, like
``RowParallelLinear(input_is_sharded=True)``. Column then row is Megatron-LM's MLP: the
defaults hand the column layer's local ``[B, h/w]`` output straight to the row layer, and
the row layer all_reduces its partial outputs.

* ``torch_tp_mlp(first, second, mesh)``: that MLP built by ``parallelize_module``;
* ``torch_tp_vs_course(first, second, x)``: run on every rank, one forward and backward of
  it and of the course's ``MegatronMLP``, and their largest differences;
* ``tp_dp_gradients(first, second, x, y, dp, tp)``: run on ``dp * tp`` ranks, a 2-D mesh
  ``("dp", "tp")``: tensor parallel inside each group of ``tp`` ranks, data parallel
  (gradients averaged) across the ``dp`` groups; returns the full gradients.

Taught in chapter 05 (appendix 05a, sections 1 and 2: PyTorch's tensor-parallel API on 1-D and
2-D meshes).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from course_utils.model_parallel.tensor_parallel import MegatronMLP

__all__ = ["torch_tp_mlp", "torch_tp_vs_course", "tp_dp_gradients"]


def _on_rank_device(*tensors_or_modules):
    """Copies on this rank's device (its GPU under NCCL, else the CPU)."""
    from course_utils.runtime.hardware import rank_device

    device = rank_device()
    return device, [copy.deepcopy(t).to(device) for t in tensors_or_modules]


def _placement(p) -> str:
    place = p.placements[0]
    return f"Shard({place.dim})" if place.is_shard() else "Replicate"


def torch_tp_mlp(first: nn.Linear, second: nn.Linear, mesh) -> nn.Sequential:
    """``Sequential(first, ReLU, second)`` (copies), tensor-parallel over the 1-D ``mesh``.

    forward: x [B, d], a plain tensor, the same on every rank of ``mesh`` -> [B, d_out],
    a plain tensor, the same on every rank. Parameters become ``DTensor``s:
    ``0.weight`` [h, d] as Shard(0), ``2.weight`` [d_out, h] as Shard(1), ``2.bias`` Replicate.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = nn.Sequential(copy.deepcopy(first), nn.ReLU(), copy.deepcopy(second))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}  # Megatron: column, then row
    return parallelize_module(model, mesh, plan)


def torch_tp_vs_course(first: nn.Linear, second: nn.Linear, x: torch.Tensor) -> dict:
    """Run on every rank: the same MLP, tensor-parallel over all ranks, built twice.

    Once by ``torch_tp_mlp`` on ``init_device_mesh(device, (world,))`` and once as the course's
    ``MegatronMLP``; one forward of x [B, d] and one backward of ``sum(out**2)`` each.
    Returns this rank's local weight shapes and the largest differences: ``"forward"``
    (outputs), ``"gradients"`` (every parameter's local gradient shard, and dL/dx).
    """
    from torch.distributed.device_mesh import init_device_mesh

    device, (first, second, x) = _on_rank_device(first, second, x)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    theirs, ours = torch_tp_mlp(first, second, mesh), MegatronMLP(first, second)
    x_theirs, x_ours = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_theirs, out_ours = theirs(x_theirs), ours(x_ours)
    out_theirs.square().sum().backward()
    out_ours.square().sum().backward()
    pairs = [  # (torch's DTensor parameter, the course's plain one)
        (theirs[0].weight, ours.column.weight),
        (theirs[0].bias, ours.column.bias),
        (theirs[2].weight, ours.row.weight),
        (theirs[2].bias, ours.row.bias),
    ]
    same_shards = all(torch.equal(p.to_local(), q) for p, q in pairs)
    grads = [(p.grad.to_local(), q.grad) for p, q in pairs] + [(x_theirs.grad, x_ours.grad)]
    return {
        "shapes": {name: list(p.to_local().shape) for name, p in theirs.named_parameters()},
        "placements": {name: _placement(p) for name, p in theirs.named_parameters()},
        "same_shards": same_shards,
        "forward": (out_theirs - out_ours).abs().max().item(),
        "gradients": max((a - b).abs().max().item() for a, b in grads),
    }


def tp_dp_gradients(
    first: nn.Linear, second: nn.Linear, x: torch.Tensor, y: torch.Tensor, dp: int, tp: int
) -> dict:
    """Run on ``dp * tp`` ranks: one training step's gradients on a 2-D mesh ``("dp", "tp")``.

    Ranks ``k*tp .. k*tp + tp - 1`` form tensor-parallel group ``k``, which takes rows
    ``k*B/dp .. (k+1)*B/dp`` of x [B, d] and y [B, d_out] (MSE loss); after backward each
    rank averages its gradient shards with the same shards of the other groups (all_reduce
    over the ``"dp"`` dimension), as plain data parallelism does. Returns this rank's
    coordinates and the full gradients (``DTensor.full_tensor()``, gathered over ``"tp"``).
    """
    from torch.distributed.device_mesh import init_device_mesh

    # details: a mesh that does not match the ranks, or a batch that does not split, is refused
    if dp * tp != dist.get_world_size():
        raise ValueError(f"a {dp} x {tp} mesh needs {dp * tp} ranks, got {dist.get_world_size()}")
    if x.shape[0] % dp:
        raise ValueError(f"a batch of {x.shape[0]} rows does not split over dp={dp}: use a multiple of {dp}")
    # end details
    device, (first, second, x, y) = _on_rank_device(first, second, x, y)
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = torch_tp_mlp(first, second, mesh["tp"])
    k, rows = mesh.get_local_rank("dp"), x.shape[0] // dp
    batch = slice(k * rows, (k + 1) * rows)
    nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
    with torch.no_grad():
        for p in model.parameters():
            local = p.grad.to_local()  # this rank's shard, shared with the DTensor gradient
            dist.all_reduce(local, group=mesh.get_group("dp"))
            local /= dp
    return {
        "coordinates": (k, mesh.get_local_rank("tp")),
        "grads": {name: p.grad.full_tensor().cpu() for name, p in model.named_parameters()},
    }
