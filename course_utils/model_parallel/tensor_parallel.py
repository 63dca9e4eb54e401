"""Tensor (intra-operation) parallelism: one ``nn.Linear`` split across ranks.

Every rank works on every layer, and a collective joins the pieces::

    column-parallel  W [out, in] split by rows of W (output features): rank r
                     computes y[:, r-th slice]; all_gather joins the columns
    row-parallel     W split by columns of W (input features): rank r multiplies
                     its slice of x; all_reduce sums the partial outputs

The collectives sit in three small autograd functions, each with its backward:
``CopyToRanks`` (identity forward, all_reduce backward), ``SumOverRanks``
(all_reduce forward, identity backward) and ``GatherColumns`` (all_gather
forward, keep this rank's slice backward). Column-parallel then row-parallel (the
Megatron-LM MLP) needs no collective between the two layers.

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language
Models Using Model Parallelism", section 3, figure 3) calls the two collectives of that MLP
``f`` and ``g``: ``f`` is ``CopyToRanks`` (identity forward, all_reduce backward), applied to
the column-parallel layer's input; ``g`` is ``SumOverRanks`` (all_reduce forward, identity
backward), applied to the row-parallel layer's partial outputs. ``MegatronMLP`` writes that
MLP with ``f`` and ``g`` in plain sight.

Taught in chapter 05 (section 6, inter-operation vs intra-operation parallelism).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "shard",
    "CopyToRanks",
    "SumOverRanks",
    "GatherColumns",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "f",
    "g",
    "MegatronMLP",
]


def shard(t: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's equal slice of ``t`` along ``dim``."""
    world = dist.get_world_size()
    if t.shape[dim] % world:
        raise ValueError(
            f"dimension {dim} of size {t.shape[dim]} cannot be split evenly across {world} ranks"
        )
    return t.chunk(world, dim)[dist.get_rank()]


class CopyToRanks(torch.autograd.Function):
    """Forward: x is already on every rank (identity). Backward: each rank holds only part
    of dL/dx, so all_reduce sums them (column-parallel's input needs this)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class SumOverRanks(torch.autograd.Function):
    """Forward: all_reduce sums the partial outputs. Backward: every rank gets the full gradient."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


def f(x: torch.Tensor) -> torch.Tensor:
    """Megatron-LM's ``f``: identity forward, all_reduce of dL/dx backward (``CopyToRanks``)."""
    return CopyToRanks.apply(x)


def g(partial: torch.Tensor) -> torch.Tensor:
    """Megatron-LM's ``g``: all_reduce (sum) forward, identity backward (``SumOverRanks``)."""
    return SumOverRanks.apply(partial)


class GatherColumns(torch.autograd.Function):
    """Forward: all_gather the ranks' [B, out/w] slices into [B, out]. Backward: keep own slice.

    Keeping only this rank's slice of dL/dy is right because every rank computes the same loss
    from the same full y, so every rank holds the same full dL/dy (Megatron assumes the same).
    """

    @staticmethod
    def forward(ctx, part):
        pieces = [torch.empty_like(part) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, part.contiguous())
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return shard(grad, -1).contiguous()


class ColumnParallelLinear(nn.Module):
    """This rank's share of ``linear``: output features r*out/w .. (r+1)*out/w.

    weight [out/w, in], bias [out/w]. forward: x [B, in] (the same on all ranks)
    -> [B, out] after all_gather (``gather_output=True``) or this rank's
    [B, out/w] (to feed a RowParallelLinear). Backward all_reduces dL/dx.
    """

    def __init__(self, linear: nn.Linear, gather_output: bool = True):
        super().__init__()
        self.weight = nn.Parameter(shard(linear.weight.detach(), 0).clone())
        self.bias = nn.Parameter(shard(linear.bias.detach(), 0).clone()) if linear.bias is not None else None
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(CopyToRanks.apply(x), self.weight, self.bias)
        return GatherColumns.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's share of ``linear``: input features r*in/w .. (r+1)*in/w.

    weight [out, in/w]; the bias is added once, after the sum. forward: x [B, in]
    (sliced here) or this rank's [B, in/w] (``input_is_sharded=True``) ->
    all_reduce of the partial products -> [B, out] on every rank.
    """

    def __init__(self, linear: nn.Linear, input_is_sharded: bool = False):
        super().__init__()
        self.weight = nn.Parameter(shard(linear.weight.detach(), 1).clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.input_is_sharded = input_is_sharded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_sharded:
            x = shard(CopyToRanks.apply(x), -1)
        y = SumOverRanks.apply(nn.functional.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y


class MegatronMLP(nn.Module):
    """The Megatron-LM MLP on ``w`` ranks: ``Z = act(X A) B`` with ``A`` split by columns and
    ``B`` by rows, so that each rank computes its slice of the hidden layer on its own.

    ``first``: ``nn.Linear(d, h)`` (A), ``second``: ``nn.Linear(h, d_out)`` (B); the hidden
    size ``h`` must divide by ``w``. Each rank keeps ``first``'s rows r*h/w .. (r+1)*h/w
    (a ``ColumnParallelLinear`` without gather) and ``second``'s matching columns (a
    ``RowParallelLinear`` on a sharded input). forward: x [B, d], the same on every rank
    -> [B, d_out] on every rank: one all_reduce forward (``g``), one backward (``f``).
    """

    def __init__(self, first: nn.Linear, second: nn.Linear, activation=torch.relu):
        super().__init__()
        hidden, world = first.out_features, dist.get_world_size()
        # details: a hidden size the ranks cannot share evenly is refused, with the fix
        if second.in_features != hidden:
            raise ValueError(
                f"first layer gives {hidden} features but the second takes {second.in_features}: "
                "the second Linear's in_features must equal the first's out_features"
            )
        if hidden % world:
            multiple = -(-hidden // world) * world
            raise ValueError(
                f"hidden size {hidden} is not divisible by the tensor-parallel degree {world}: "
                f"use a hidden size that is a multiple of {world} (e.g. {multiple}), "
                f"or a number of ranks that divides {hidden}"
            )
        # end details
        self.column = ColumnParallelLinear(first, gather_output=False)  # A's rows: [h/w, d]
        self.row = RowParallelLinear(second, input_is_sharded=True)  # B's columns: [d_out, h/w]
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = f(x)  # identity; backward: all_reduce dL/dx
        hidden = self.activation(nn.functional.linear(x, self.column.weight, self.column.bias))
        out = g(nn.functional.linear(hidden, self.row.weight))  # sum the ranks' partial products
        return out + self.row.bias if self.row.bias is not None else out
