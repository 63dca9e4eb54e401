"""Model parallelism: put different parts of one model on different devices.

Inter-operation ("vertical") parallelism cuts an ``nn.Sequential`` into
consecutive parts, one per device; ``forward`` moves the activation to the next
part's device, the ``.cuda(n)`` / ``.to(device)`` idiom::

    part0.to(dev0); part1.to(dev1)
    y = part1(part0(x.to(dev0)).to(dev1))     # autograd moves gradients back

Each device holds only its part's weights, but only one device works at a time.

Intra-operation ("tensor") parallelism splits one ``nn.Linear`` across ranks,
so every rank works on every layer and a collective joins the pieces:

    column-parallel  W [out, in] split by rows of W (output features): rank r
                     computes y[:, r-th slice]; all_gather joins the columns
    row-parallel     W split by columns of W (input features): rank r multiplies
                     its slice of x; all_reduce sums the partial outputs
"""
from __future__ import annotations

import time
import warnings
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from .timing import synchronize


def partition_sequential(model: nn.Sequential, parts: int | Sequence[int]) -> list[nn.Sequential]:
    """Cut ``model`` into consecutive pieces: ``parts`` equal ones, or the given layer counts.

    The pieces share the model's modules (no copy) and keep its layer names,
    so ``piece.named_parameters()`` names match the whole model's.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"partition_sequential needs an nn.Sequential, got {type(model).__name__}")
    n = len(model)
    if isinstance(parts, int):
        if parts < 1 or n % parts:
            raise ValueError(f"cannot cut {n} layers into {parts} equal parts: use a number of parts that "
                             f"divides {n}, or give the layer count of each part, e.g. sizes summing to {n}")
        sizes = [n // parts] * parts
    else:
        sizes = [int(s) for s in parts]
        if min(sizes, default=0) < 1 or sum(sizes) != n:
            raise ValueError(f"part sizes {sizes} must be positive and add up to the model's {n} layers")
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [model[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class VerticalSplit(nn.Module):
    """``model`` cut into ``len(devices)`` consecutive parts, part k on ``devices[k]``.

    forward: x [B, ...] on any device -> output on ``devices[-1]``; the
    activation hops ``.to(devices[k])`` before part k. Gradients flow back
    through the same hops. ``sizes``: layers per part (default: equal).
    """

    def __init__(self, model: nn.Sequential, devices: Sequence[torch.device], sizes: Sequence[int] | None = None):
        super().__init__()
        self.devices = [torch.device(d) for d in devices]
        self.parts = nn.ModuleList(part.to(dev) for part, dev in
                                   zip(partition_sequential(model, sizes or len(self.devices)), self.devices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part, device in zip(self.parts, self.devices):
            x = part(x.to(device))
        return x

    def memory_per_device(self, example: torch.Tensor, optimizer_copies: int = 2):
        """DataFrame, one row per part: its device, layers, parameters, and MB of weights,
        gradients, optimizer state (``optimizer_copies`` per weight: Adam 2) and activations
        on ``example`` ([B, ...]), counted as the outputs of every leaf layer (about what
        autograd keeps for backward)."""
        import pandas as pd

        kept = [0] * len(self.parts)
        hooks = [layer.register_forward_hook(lambda mod, inp, out, k=k: kept.__setitem__(k, kept[k] + out.nbytes))
                 for k, part in enumerate(self.parts) for layer in part.modules() if not list(layer.children())]
        try:
            with torch.no_grad():
                self(example)
        finally:
            for h in hooks:
                h.remove()
        rows = []
        for k, (part, device) in enumerate(zip(self.parts, self.devices)):
            params = sum(p.numel() for p in part.parameters())
            weight_bytes = sum(p.nbytes for p in part.parameters())
            rows.append({"part": k, "device": str(device), "layers": len(part), "parameters": params,
                         "weights_MB": weight_bytes / 1e6, "gradients_MB": weight_bytes / 1e6,
                         "optimizer_MB": optimizer_copies * weight_bytes / 1e6, "activations_MB": kept[k] / 1e6})
        return pd.DataFrame(rows).set_index("part")


def timed_training_step(split: VerticalSplit, x: torch.Tensor, y: torch.Tensor, loss_fn=nn.MSELoss()):
    """Run one forward + backward of ``split`` and measure when each part worked.

    Returns a pipeline ``Timeline`` (ms) with F(k,0) and B(k,0) per part k on row k:
    hooks stamp each part's forward start/end and the moment autograd reaches
    each part's output gradient (the start of B(k,0)); B(k,0) ends where B(k-1,0)
    starts, and B(0,0) when ``backward`` returns. Gradients are left in ``.grad``.
    Every stamp first synchronises all the split's devices (a GPU works on after a
    call returns), so each piece of work is charged to the part that did it.
    """
    from .pipeline.schedules import Action
    from .pipeline.timeline import Event, Timeline

    marks: dict = {}

    def stamp(key):
        def hook(*_):
            synchronize(*split.devices)
            marks[key] = time.perf_counter()
        return hook

    hooks = []
    for k, part in enumerate(split.parts):
        hooks += [part.register_forward_pre_hook(stamp(("F0", k))), part.register_forward_hook(stamp(("F1", k))),
                  part.register_full_backward_pre_hook(stamp(("B0", k)))]
    try:
        with warnings.catch_warnings():   # part 0's input needs no gradient: its pre-hook still fires
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            synchronize(*split.devices)
            t0 = time.perf_counter()
            loss = loss_fn(split(x), y.to(split.devices[-1]))
            loss.backward()
            stamp(("B0", -1))()
    finally:
        for h in hooks:
            h.remove()
    events = []
    for k in range(len(split.parts)):
        ms = lambda key: (marks[key] - t0) * 1e3   # noqa: E731
        events.append(Event(k, Action("F", k, 0), ms(("F0", k)), ms(("F1", k))))
        events.append(Event(k, Action("B", k, 0), ms(("B0", k)), ms(("B0", k - 1))))
    return Timeline(tuple(events), len(split.parts), name="vertical model parallel, 1 step", unit="ms")


# --- embedding tables on different devices --------------------------------------------------

def place_embedding_tables(model, devices: Sequence[torch.device], balance: bool = True) -> list[int]:
    """Move each table of a DLRM (``model.embeddings``) to one of ``devices``; the dense
    MLPs stay where they are. ``balance``: largest table first, each onto the device
    holding the fewest bytes so far (greedy); else round robin. Returns each table's
    index into ``devices``."""
    sizes = [bag.weight.nbytes for bag in model.embeddings]
    if balance:
        load, where = [0] * len(devices), [0] * len(sizes)
        for t in sorted(range(len(sizes)), key=lambda t: -sizes[t]):
            where[t] = min(range(len(devices)), key=lambda d: load[d])
            load[where[t]] += sizes[t]
    else:
        where = [t % len(devices) for t in range(len(sizes))]
    for bag, d in zip(model.embeddings, where):
        bag.to(devices[d])
    return where


def lookup_placed(model, sparse: torch.Tensor, output_device: torch.device) -> torch.Tensor:
    """Embedding lookups where each table lives: ``sparse [B, T] int64`` -> ``[B, T, D]`` on
    ``output_device``. Only the ids travel to a table's device, and only [B, D] comes back."""
    out = []
    for t, bag in enumerate(model.embeddings):
        ids = sparse[:, t:t + 1].to(bag.weight.device)
        out.append(bag(ids).to(output_device))
    return torch.stack(out, dim=1)


# --- tensor (intra-operation) parallelism across ranks --------------------------------------

def _shard(t: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's equal slice of ``t`` along ``dim``."""
    world = dist.get_world_size()
    if t.shape[dim] % world:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} cannot be split evenly across {world} ranks")
    return t.chunk(world, dim)[dist.get_rank()]


class _CopyToRanks(torch.autograd.Function):
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


class _SumOverRanks(torch.autograd.Function):
    """Forward: all_reduce sums the partial outputs. Backward: every rank gets the full gradient."""
    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class _GatherColumns(torch.autograd.Function):
    """Forward: all_gather the ranks' [B, out/w] slices into [B, out]. Backward: keep own slice."""
    @staticmethod
    def forward(ctx, part):
        pieces = [torch.empty_like(part) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, part.contiguous())
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return _shard(grad, -1).contiguous()


class ColumnParallelLinear(nn.Module):
    """This rank's share of ``linear``: output features r*out/w .. (r+1)*out/w.

    weight [out/w, in], bias [out/w]. forward: x [B, in] (the same on all ranks)
    -> [B, out] after all_gather (``gather_output=True``) or this rank's
    [B, out/w] (to feed a RowParallelLinear). Backward all_reduces dL/dx.
    """

    def __init__(self, linear: nn.Linear, gather_output: bool = True):
        super().__init__()
        self.weight = nn.Parameter(_shard(linear.weight.detach(), 0).clone())
        self.bias = nn.Parameter(_shard(linear.bias.detach(), 0).clone()) if linear.bias is not None else None
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(_CopyToRanks.apply(x), self.weight, self.bias)
        return _GatherColumns.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's share of ``linear``: input features r*in/w .. (r+1)*in/w.

    weight [out, in/w]; the bias is added once, after the sum. forward: x [B, in]
    (sliced here) or this rank's [B, in/w] (``input_is_sharded=True``) ->
    all_reduce of the partial products -> [B, out] on every rank.
    """

    def __init__(self, linear: nn.Linear, input_is_sharded: bool = False):
        super().__init__()
        self.weight = nn.Parameter(_shard(linear.weight.detach(), 1).clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.input_is_sharded = input_is_sharded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_sharded:
            x = _shard(_CopyToRanks.apply(x), -1)
        y = _SumOverRanks.apply(nn.functional.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y
