"""How much of the gradient communication DDP hides behind backward, measured on a wire.

On two CPU cores gloo's all-reduce runs on the same cores as backward, so overlap can hide
little and the step times say more about core contention than about networks. On a wire
(``course_utils.runtime.wire``) a message costs what the modeled network says, and waiting for
it costs no CPU: a bucket in flight really does travel while backward computes, as on a GPU.

The model trained is the dense tower of a large recommender: ``depth`` square layers of
``width`` (``tower``), whose gradients arrive one layer after the other during backward, the
case bucketing is built for. (A DLRM's dense embedding-table gradients come last in backward,
all at once, with nothing left to hide behind: one more reason why chapter 07 shards the tables
instead of all-reducing them.)

* ``step_seconds``: on every rank, median step time of each variant (naive, bucketed at given
  bucket sizes, torch DDP), interleaved round by round, and each variant's bucket bytes;
* ``modeled_communication``: the model's seconds for those buckets' all-reduces;
* ``predicted_step``: the model's step time at any world size, for the same buckets (a
  prediction: on two cores more ranks would measure core contention, not the network);
* ``hidden_fraction``: ``1 - (step on the wire - the same step on plain gloo) / modeled
  communication``: 1 when all of it hides behind backward, 0 when none does. Both steps run in
  the same processes, taking turns (``also_on_gloo=True``), so they pay the same DDP
  bookkeeping (hooks, copies into buckets) and meet the same machine; what differs is the
  network. (gloo's own all-reduce, a few ms on two cores, counts as hidden: keep the wire's
  communication well above it.)

Taught in chapter 04 (section 5, overlap under a wire, and the bucket-size sweep).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from course_utils.ddp.train import wrap
from course_utils.runtime import compat
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.timing import synchronize
from course_utils.runtime.wire import Wire, collective_seconds

__all__ = ["tower", "step_seconds", "modeled_communication", "hidden_fraction", "predicted_step"]


def tower(width: int = 512, depth: int = 8, seed: int = 0) -> nn.Sequential:
    """``depth`` x (Linear(width, width), ReLU), then Linear(width, 1): input ``[rows, width]``,
    output ``[rows, 1]``; ``depth * width * (width + 1)`` float32 parameters before the head."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def _wrapped(model: nn.Module, kind: str, options: dict, group) -> nn.Module:
    if kind == "none":
        return model
    if group is None:
        return wrap(model, kind, **options)
    key = "process_group" if kind == "torch" else "group"
    return wrap(model, kind, **options, **{key: group})


def _bucket_bytes(model: nn.Module, kind: str) -> list[int]:
    if kind == "none":
        return []
    if kind == "naive":
        return [p.numel() * p.element_size() for p in model.parameters()]
    if kind == "bucketed":
        return [bucket.nbytes for bucket in model.buckets]
    return compat.ddp_bucket_sizes(model)["rebuilt"]


def step_seconds(
    variants: dict[str, tuple[str, dict]],
    width: int = 512,
    depth: int = 8,
    rows: int = 256,
    steps: int = 6,
    rounds: int = 2,
    also_on_gloo: bool = False,
) -> dict:
    """On every rank (call through ``launch``): time SGD steps of ``tower`` under each variant.

    ``variants``: ``{label: (kind, wrap options)}``, kind ``"naive"``, ``"bucketed"`` or
    ``"torch"`` (``ddp.train.wrap``), or ``"none"``: the bare model, no communication at all.
    Each rank trains on its own random ``[rows, width]`` batch, on its device (its GPU under
    NCCL, synchronized before each clock reading). The first two steps of each run are not
    timed (buckets are rebuilt after the first).
    Returns ``{"seconds": {label: median step seconds, the slowest rank's},
    "bucket_bytes": {label: [bytes per all-reduce of a step]},
    "parameters": {label: [this rank's final parameters]},
    "waits": {label: median seconds a rank still waited for its averaged gradients once backward
    was done (``finish_gradient_sync``; the slowest rank's), for the by-hand kinds}}``, and with a
    ``"none"`` variant ``"backward"``: its median backward seconds (this rank's). ``also_on_gloo``:
    every variant also runs, in turn, on a plain gloo group of the same ranks, its medians in
    ``"on_gloo"``. (torch's DDP finishes its sync inside ``backward()`` itself, so it has no wait.)
    """
    networks = {"default": None}
    if also_on_gloo:
        networks["gloo"] = dist.new_group(backend="gloo")
    times = {(net, label): [] for label in variants for net in networks}  # each variant on both, in turn
    waits = {label: [] for label, (kind, _) in variants.items() if kind in ("naive", "bucketed")}
    buckets, parameters, backward = {}, {}, []
    device = rank_device()
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(rows, width, generator=g).to(device), torch.randn(rows, 1, generator=g).to(device)
    for _ in range(rounds):
        for (net, label), (kind, options) in ((key, variants[key[1]]) for key in times):
            model = _wrapped(tower(width, depth).to(device), kind, options, networks[net])
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            for step in range(steps + 2):
                synchronize(device)
                dist.barrier()
                start = time.monotonic()
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(x), y)
                if kind == "none":
                    synchronize(device)
                    backward_start = time.monotonic()
                loss.backward()
                if kind == "none" and step >= 2 and net == "default":
                    synchronize(device)
                    backward.append(time.monotonic() - backward_start)
                backward_end = time.monotonic()
                if kind in ("naive", "bucketed"):
                    model.finish_gradient_sync()  # naive: sends everything now; bucketed: waits for the rest
                    synchronize(device)
                waited = time.monotonic() - backward_end
                opt.step()
                synchronize(device)
                took = torch.tensor([time.monotonic() - start, waited], dtype=torch.float64, device=device)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if step >= 2:
                    times[net, label].append(took[0].item())
                    if label in waits and net == "default":
                        waits[label].append(took[1].item())
            if net == "default":
                buckets[label] = _bucket_bytes(model, kind)
                parameters[label] = [p.detach().clone() for p in model.parameters()]
    medians = {key: statistics.median(ts) for key, ts in times.items()}
    seconds = {label: medians["default", label] for label in variants}
    result = {
        "seconds": seconds,
        "bucket_bytes": buckets,
        "parameters": parameters,
        "waits": {label: statistics.median(ws) for label, ws in waits.items()},
    }
    if also_on_gloo:
        result["on_gloo"] = {label: medians["gloo", label] for label in variants}
    if backward:
        result["backward"] = statistics.median(backward)
    return result


def modeled_communication(wire: Wire, bucket_bytes: list[int], world_size: int) -> float:
    """Seconds the wire's model gives one step's all-reduces of ``bucket_bytes``, one after another."""
    alpha, beta = wire.link(list(range(world_size)))
    return sum(collective_seconds("all_reduce", n, world_size, alpha, beta) for n in bucket_bytes)


def hidden_fraction(step_on_wire: float, step_without: float, communication: float) -> float:
    """``1 - (step_on_wire - step_without) / communication``: the share of the modeled
    communication that did not lengthen the step (``step_without``: the same step on gloo)."""
    if communication <= 0:
        raise ValueError(f"communication must be positive seconds, got {communication!r}")
    return 1 - (step_on_wire - step_without) / communication


def predicted_step(
    compute: float, backward: float, bucket_bytes: list[int], wire: Wire, world_size: int
) -> float:
    """The step the wire's model predicts: ``compute`` seconds of the step on a free network
    (DDP's own work included), of which ``backward`` is the backward pass; bucket ``i`` of ``k``
    is ready ``(i+1)/k`` of the way through backward (layers of equal cost) and queues on the
    link behind the bucket before it. The step ends with the later of backward and the last
    all-reduce.
    """
    alpha, beta = wire.link(list(range(world_size)))
    k = len(bucket_bytes)
    free = 0.0
    for i, n in enumerate(bucket_bytes):
        ready = backward * (i + 1) / k
        free = max(ready, free) + collective_seconds("all_reduce", n, world_size, alpha, beta)
    return compute + max(0.0, free - backward)
