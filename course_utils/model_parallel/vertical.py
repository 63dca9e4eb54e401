"""Model parallelism: put different parts of one model on different devices.

Inter-operation ("vertical") parallelism cuts an ``nn.Sequential`` into
consecutive parts, one per device; ``forward`` moves the activation to the next
part's device, the ``.cuda(n)`` / ``.to(device)`` idiom::

    part0.to(dev0); part1.to(dev1)
    y = part1(part0(x.to(dev0)).to(dev1))     # autograd moves gradients back

Each device holds only its part's weights, but only one device works at a time
(``course_utils.pipeline.vertical.split_step`` times it on modeled GPUs, the hop a message
between them). Embedding tables are placed the same way, whole tables on different devices
(``place_embedding_tables``, largest first with ``place_largest_first``; ``lookup_placed``). A
split model trains data-parallel too: ``ddp_split_gradients`` wraps it in
``DistributedDataParallel(..., device_ids=None)`` on ``rank_devices`` (several devices per rank).
Splitting one layer across ranks instead is tensor parallelism:
``course_utils.model_parallel.tensor_parallel``.

Layers created on different devices and put in one ``nn.Sequential`` are *not* a
split: ``Sequential`` moves no activation, and the first layer on another device
raises a device-mismatch error. The hop has to be in a ``forward``, as here.

Taught in chapter 05.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils.model_parallel.activation_memory import saved_for_backward
from course_utils.runtime.checks import check_whole
from course_utils.runtime.hardware import gpu_count


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
            raise ValueError(
                f"cannot cut {n} layers into {parts} equal parts: use a number of parts that "
                f"divides {n}, or give the layer count of each part, e.g. sizes summing to {n}"
            )
        sizes = [n // parts] * parts
    else:
        sizes = [int(s) for s in parts]
        if min(sizes, default=0) < 1 or sum(sizes) != n:
            raise ValueError(f"part sizes {sizes} must be positive and add up to the model's {n} layers")
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [model[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]


class VerticalSplit(nn.Module):
    """``model`` cut into ``len(devices)`` consecutive parts, part k on ``devices[k]``.

    forward: x [B, ...] on any device -> output on ``devices[-1]``; the
    activation hops ``.to(devices[k])`` before part k. Gradients flow back
    through the same hops. ``sizes``: layers per part (default: equal).
    """

    def __init__(
        self, model: nn.Sequential, devices: Sequence[torch.device], sizes: Sequence[int] | None = None
    ):
        super().__init__()
        self.devices = [torch.device(d) for d in devices]
        self.parts = nn.ModuleList(
            part.to(dev)
            for part, dev in zip(
                partition_sequential(model, sizes or len(self.devices)), self.devices, strict=False
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part, device in zip(self.parts, self.devices, strict=False):
            x = part(x.to(device))
        return x

    def memory_per_device(self, example: torch.Tensor, optimizer_copies: int = 2):
        """DataFrame, one row per part: its device, layers, parameters, and MB of weights,
        gradients, optimizer state (``optimizer_copies`` per weight: Adam 2) and activations
        on ``example`` ([B, ...]): what autograd saves for the backward pass in that part,
        measured with ``saved_tensors_hooks`` (``activation_memory.saved_for_backward``)."""
        import pandas as pd

        kept = []
        x = example
        for part, device in zip(self.parts, self.devices, strict=False):
            saved = saved_for_backward(part, x.to(device))
            kept.append(saved.activation_bytes)
            x = saved.output.detach()
        rows = []
        for k, (part, device) in enumerate(zip(self.parts, self.devices, strict=False)):
            params = sum(p.numel() for p in part.parameters())
            weight_bytes = sum(p.nbytes for p in part.parameters())
            rows.append(
                {
                    "part": k,
                    "device": str(device),
                    "layers": len(part),
                    "parameters": params,
                    "weights_MB": weight_bytes / 1e6,
                    "gradients_MB": weight_bytes / 1e6,
                    "optimizer_MB": optimizer_copies * weight_bytes / 1e6,
                    "activations_MB": kept[k] / 1e6,
                }
            )
        return pd.DataFrame(rows).set_index("part")


class TwoGPUSplit(nn.Module):
    """The two-GPU idiom as written for real GPUs: ``model`` cut in two halves, the first
    moved with ``.cuda(first)``, the second with ``.cuda(second)``, and the activation moved
    in ``forward``. Needs two CUDA GPUs (``VerticalSplit`` runs the same idea on any devices).

    forward: x [B, ...] on any device -> output on ``cuda:<second>``. ``.to()`` is recorded
    by autograd, so backward copies the gradient from the second GPU back to the first.
    """

    def __init__(self, model: nn.Sequential, first: int = 0, second: int = 1):
        super().__init__()
        part0, part1 = partition_sequential(model, 2)
        self.first, self.second = first, second
        self.part0 = part0.cuda(first)  # same as .to(f"cuda:{first}")
        self.part1 = part1.cuda(second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.part0(x.to(f"cuda:{self.first}"))
        return self.part1(x.to(f"cuda:{self.second}"))  # the hop: the activation moves to the second GPU


# --- data parallel over a split model ------------------------------------------------------


def rank_devices(per_rank: int) -> list[torch.device]:
    """This rank's ``per_rank`` devices, once its process group is up: GPUs
    ``rank * per_rank .. rank * per_rank + per_rank - 1`` when the machine has ``per_rank``
    GPUs for every rank, else ``per_rank`` CPU stand-ins."""
    check_whole("rank_devices: per_rank", per_rank)
    rank, world = dist.get_rank(), dist.get_world_size()
    if gpu_count() >= per_rank * world:
        return [torch.device("cuda", rank * per_rank + k) for k in range(per_rank)]
    return [torch.device("cpu")] * per_rank


def ddp_split_gradients(
    model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, parts_per_rank: int = 2
) -> dict:
    """Run on every rank: data parallel (DDP) over a model split across this rank's devices.

    ``model``: the same ``nn.Sequential`` on every rank; ``x [B, ...]``, ``y [B, ...]``: the
    global batch (B divisible by the world size), of which each rank takes its slice. The
    model is cut into ``parts_per_rank`` parts on ``rank_devices(parts_per_rank)`` and wrapped
    in ``DistributedDataParallel(split, device_ids=None)``: for a module that spans several
    devices (and for a CPU module) PyTorch requires ``device_ids=None``; the module's own
    ``forward`` moves the activations and decides where the output lives. One forward and
    backward (MSE loss); DDP averages the gradients over the ranks.

    Returns ``{"devices": the parameters' devices, "multi_device": DDP's view of the module,
    "grads": {parameter name: averaged gradient, on the CPU}}``.
    """
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    # details: a batch that does not split evenly is refused
    if x.shape[0] % world:
        raise ValueError(
            f"a batch of {x.shape[0]} rows does not split evenly over {world} ranks: "
            f"use a batch size that is a multiple of {world}"
        )
    # end details
    split = VerticalSplit(model, rank_devices(parts_per_rank))
    ddp = DistributedDataParallel(split, device_ids=None)
    rows = slice(rank * x.shape[0] // world, (rank + 1) * x.shape[0] // world)
    out = ddp(x[rows])
    nn.functional.mse_loss(out, y[rows].to(out.device)).backward()
    return {
        "devices": sorted({str(p.device) for p in split.parameters()}),
        "multi_device": ddp.is_multi_device_module,
        "grads": {name: p.grad.cpu() for name, p in split.named_parameters()},
    }


# --- embedding tables on different devices --------------------------------------------------


def place_largest_first(sizes: Sequence[int], bins: int) -> list[int]:
    """Greedy placement: the largest item first (ties: the lower index), each onto the bin holding
    the least so far (ties: the lower bin). Returns each item's bin. Used for tables on devices
    (:func:`place_embedding_tables`), and by chapter 07 for table-wise plans
    (``course_utils.sharding.plan``)."""
    held, where = [0] * bins, [0] * len(sizes)
    for t in sorted(range(len(sizes)), key=lambda t: (-sizes[t], t)):
        where[t] = held.index(min(held))
        held[where[t]] += sizes[t]
    return where


def place_embedding_tables(model, devices: Sequence[torch.device], balance: bool = True) -> list[int]:
    """Move each table of a DLRM (``model.embeddings``) to one of ``devices``; the dense
    MLPs stay where they are. ``balance``: largest table first, each onto the device
    holding the fewest bytes so far (greedy); else round robin. Returns each table's
    index into ``devices``."""
    sizes = [bag.weight.nbytes for bag in model.embeddings]
    if balance:  # greedy, as chapter 07's table-wise sharding places whole tables on ranks
        where = place_largest_first(sizes, len(devices))
    else:
        where = [t % len(devices) for t in range(len(sizes))]
    for bag, d in zip(model.embeddings, where, strict=False):
        bag.to(devices[d])
    return where


def lookup_placed(model, sparse: torch.Tensor, output_device: torch.device) -> torch.Tensor:
    """Embedding lookups where each table lives: ``sparse [B, T] int64`` -> ``[B, T, D]`` on
    ``output_device``. Only the ids travel to a table's device, and only [B, D] comes back."""
    out = []
    for t, bag in enumerate(model.embeddings):
        ids = sparse[:, t : t + 1].to(bag.weight.device)
        out.append(bag(ids).to(output_device))
    return torch.stack(out, dim=1)
