"""PyTorch's own DDP benchmark, modeled: ResNet-50 on DGX-1 nodes of V100s, against its published times.

The benchmark (``benchmarks/distributed/ddp/benchmark.py`` and its ``README.md`` in PyTorch's
repository) trains torchvision's ResNet-50 on 32 random 224 x 224 images per GPU, in float32,
with SGD (momentum 0.9, weight decay 1e-4) and ``DistributedDataParallel(bucket_cap_mb=25,
broadcast_buffers=False)`` over NCCL, and reports the median seconds per iteration (forward, loss,
backward, optimizer step, ``torch.cuda.synchronize``) on 1 GPU without DDP and on 1 to 16 GPUs of
DGX-1 machines (8 V100 each; "2M/8G" is two machines) with "4x 100Gb InfiniBand per machine".

The model here runs the same iteration at the same sizes on the ``meta`` device (``resnet50``
by hand: torchvision is not a course dependency), wrapped in the course's ``BucketedDDP`` with
the same buckets (1 MiB first, then 25 MiB; PyTorch's DDP cannot be built on ``meta``), on a
modeled DGX-1 cluster:

* ``V100``: the V100 SXM2 preset with its achieved compute fraction set from one point,
  ``calibrate``: the fraction at which the modeled 1-GPU iteration lasts the published 0.097 s;
* ``DGX1``: NVLink 2 inside a node of 8 (300 GB/s per V100 both ways, 150 each way: NVIDIA's V100
  datasheet), and between the two nodes a ring through four 100 Gb/s InfiniBand ports, 50 GB/s
  (NCCL runs one ring per port; NVIDIA/nccl-tests issue 29 quotes NCCL's GTC 2017 talk at about
  40 GB/s of all-reduce bus bandwidth between DGX-1 nodes); ``comm_sms``: NCCL's channels, one SM
  each: 8, as a multi-node NCCL log of 8-GPU nodes shows ("Channel 00/08", NVIDIA/nccl issue 514).

``iteration_seconds`` runs on every rank of one launch of 16 and times every size in turn on a
group of the first ``w`` ranks: one launch instead of five.

Taught in chapter 04 (appendix 04b, section 5: the model against published GPU measurements).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_utils.ddp.bucketed import BucketedDDP
from course_utils.runtime import compat
from course_utils.runtime.cluster import DEVICES, Cluster, Wire, modeled_ns, timeline
from course_utils.runtime.cluster.roofline import op_cost
from course_utils.workload.resnet import resnet50

__all__ = ["PUBLISHED", "SOURCE", "DGX1", "iteration", "calibrate", "iteration_seconds"]

SOURCE = "github.com/pytorch/pytorch, benchmarks/distributed/ddp/README.md (ResNet-50, batch 32, p50)"

#: Median seconds per iteration from the README, by GPUs ("no DDP": one GPU without the wrapper).
PUBLISHED = {"no DDP": 0.097, 1: 0.100, 2: 0.103, 4: 0.103, 8: 0.104, 16: 0.104}

BATCH = 32  #: images per GPU

#: Two DGX-1 nodes (module docstring): NVLink 2 inside a node of 8, InfiniBand between them.
DGX1 = Wire(
    latency_s=10e-6,
    bandwidth_Bps=50e9,
    name="DGX-1 nodes: NVLink 2 inside, 4x 100 Gb/s InfiniBand between",
    ranks_per_node=8,
    node_latency_s=5e-6,
    node_bandwidth_Bps=150e9,
    comm_sms=8,
    source="NVIDIA Tesla V100 datasheet: NVLink 300 GB/s (150 each way); PyTorch's DDP benchmark README: "
    "4x 100Gb InfiniBand per machine (4 x 12.5 GB/s); NVIDIA/nccl-tests issue 29: about 40 GB/s "
    "all-reduce bus bandwidth between DGX-1 nodes in NCCL's GTC 2017 talk; NVIDIA/nccl issue 514: "
    "8 channels in a multi-node log of 8-GPU nodes",
)


def iteration(model: nn.Module, ddp: BucketedDDP | None, optimizer, images, labels) -> None:
    """One iteration of the benchmark's loop: forward, cross-entropy, backward, (the by-hand DDP's
    wait for its buckets), SGD step. Like the benchmark, it never zeroes the gradients."""
    logits = (ddp or model)(images)
    nn.functional.cross_entropy(logits, labels).backward()
    if ddp is not None:
        ddp.finish_gradient_sync()
    optimizer.step()


def _setup(device="meta"):
    with torch.device(device):
        model = resnet50()
        images, labels = torch.empty(BATCH, 3, 224, 224), torch.zeros(BATCH, dtype=torch.long)
    optimizer = torch.optim.SGD(model.parameters(), 0.001, momentum=0.9, weight_decay=1e-4)
    return model, optimizer, images, labels


class _Recorder(compat.DISPATCH_MODE_BASE):
    """Keeps every operator run under it, with its arguments and result (meta tensors: no data)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def calibrate(target_s: float = PUBLISHED["no DDP"], device=DEVICES["v100"]):
    """``device`` with the compute fraction at which one GPU's iteration (no DDP, after a first
    one that creates the gradients) is priced ``target_s``: the same roofline the cluster charges
    (``roofline.op_cost``), solved by bisection. Returns ``(device, modeled seconds)``."""
    model, optimizer, images, labels = _setup()
    iteration(model, None, optimizer, images, labels)  # the first creates .grad and momentum
    with _Recorder() as recorder:
        iteration(model, None, optimizer, images, labels)

    def seconds(fraction: float) -> float:
        cluster = Cluster(device.replace(compute_efficiency=fraction), DGX1)
        costs = (op_cost(func, args, kwargs, out, cluster) for func, args, kwargs, out in recorder.ops)
        return sum(c.ns for c in costs if c is not None) / 1e9

    low, high = 0.01, 1.0
    if seconds(high) > target_s:
        raise ValueError(f"even at its full peak {device.name} needs more than {target_s} s")
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if seconds(middle) > target_s else (low, middle)
    fraction = round(high, 4)
    return device.replace(compute_efficiency=fraction), seconds(fraction)


def iteration_seconds(sizes=(1, 2, 4, 8, 16)) -> dict:
    """On every rank of ``launch(..., world_size=max(sizes), cluster=...)``: the modeled seconds of
    the benchmark's iteration, on one GPU without DDP and, for each ``w`` of ``sizes``, under
    ``BucketedDDP`` on a group of ranks ``0 .. w-1``, each timed on its second iteration (the first
    creates the gradients and rebuilds the buckets). Returns on rank 0 ``{"seconds": {"no DDP" or
    w: seconds}, "buckets": [bytes of each bucket], "timeline": rank 0's ClusterTimeline of the
    largest size's timed iteration}``; ``{}`` on the other ranks."""
    me, seconds, window = dist.get_rank(), {}, None
    runs = [("no DDP", None)] + [(w, dist.new_group(list(range(w)))) for w in sizes]  # all ranks, every group
    for name, group in runs:
        if (group is None and me != 0) or (group is not None and me >= name):
            continue
        model, optimizer, images, labels = _setup()
        ddp = None if group is None else BucketedDDP(model, bucket_cap_mb=25.0, group=group)
        iteration(model, ddp, optimizer, images, labels)
        if group is not None:
            dist.barrier(group=group)  # the timed iterations start together
        start = modeled_ns()
        iteration(model, ddp, optimizer, images, labels)
        seconds[name], window = (modeled_ns() - start) / 1e9, (start, modeled_ns())
    if me != 0:
        return {}
    return {
        "seconds": seconds,
        "buckets": [b.nbytes for b in ddp.buckets],
        "timeline": timeline().window(*window),
    }
