"""How much of the gradient communication DDP hides behind backward, timed on a modeled GPU cluster.

Under ``launch(..., cluster=Cluster(...))`` every operator is priced on the modeled GPU and every
all-reduce on the modeled network, in virtual time (``course_utils.runtime.cluster``): step times,
and what overlapped what, are exact and the same on every machine. The ranks still train for real
(gloo adds the gradients), so PyTorch's own DDP runs beside the course's. Without a cluster the
same code measures wall time (``timing.now``, the devices synchronised): on GPUs, that is real.

The workload is the dense part of MLPerf's DLRM (``MLPERF_DLRM``: the course's DLRM with the MLP
sizes of MLPerf Training's DLRM on Criteo Terabyte, 2.37 million parameters, 9.5 MB of float32
gradients), its 26 tables one row each here: at scale the tables are sharded (chapter 07), and
DDP all-reduces the dense part.

* ``step_profile``: on every rank, one timed SGD step of each variant after its warm-up steps
  (``"none"``: no communication; ``"naive"``, ``"bucketed"``, ``"torch"``: ``train.wrap``): the
  step, the wait for the averaged gradients after backward, and, from the rank's timeline, its
  all-reduces, their time, and how much of it the GPU spent computing (``hidden_ns``);
* ``step_seconds``: the older measure on a tower of square layers (median step seconds per
  variant; ``scripts.gpu_report`` times it on real GPUs);
* ``tower``: that tower.

Taught in chapter 04 (section 5b: overlap, the bucket size, DDP against one GPU).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from torch import nn

from course_utils.ddp.train import wrap
from course_utils.runtime import compat
from course_utils.runtime.cluster import ClusterTimeline, installed, timeline
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.timing import now, synchronize
from course_utils.workload.models import DLRMConfig

__all__ = ["MLPERF_DLRM", "tower", "dlrm_batch", "step_profile", "step_seconds", "hidden_ns"]

#: MLPerf Training's DLRM (Criteo Terabyte, v0.7 to v2.1): embeddings of 128, bottom MLP
#: 13-512-256-128, top MLP 479-1024-1024-512-256-1; one row per table (sharded at scale).
MLPERF_DLRM = DLRMConfig((1,) * 26, embedding_dim=128, bottom_mlp=(512, 256), top_mlp=(1024, 1024, 512, 256))

WARMUP = {"none": 0, "naive": 1, "bucketed": 1, "torch": 2}  #: steps before the timed one, by kind


def tower(width: int = 512, depth: int = 8, seed: int = 0) -> nn.Sequential:
    """``depth`` x (Linear(width, width), ReLU), then Linear(width, 1): input ``[rows, width]``,
    output ``[rows, 1]``; ``depth * width * (width + 1)`` float32 parameters before the head."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def dlrm_batch(config: DLRMConfig, rows: int, seed: int, device=None) -> tuple[torch.Tensor, ...]:
    """A random batch for ``config``: ``dense [rows, n_dense]``, ``sparse [rows, T]`` (valid ids),
    ``label [rows]``."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(rows, config.n_dense, generator=g)
    sparse = torch.stack([torch.randint(0, n, (rows,), generator=g) for n in config.cardinalities], 1)
    label = torch.randint(0, 2, (rows,), generator=g).float()
    return (
        tuple(t.to(device) for t in (dense, sparse, label)) if device is not None else (dense, sparse, label)
    )


def _union(spans) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s in sorted(spans, key=lambda s: (s.start_ns, s.end_ns)):
        if merged and s.start_ns <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], s.end_ns)
        elif s.end_ns > s.start_ns:
            merged.append([s.start_ns, s.end_ns])
    return [(a, b) for a, b in merged]


def hidden_ns(line: ClusterTimeline, rank: int) -> tuple[int, int]:
    """``(communication, hidden)`` nanoseconds of ``rank`` in ``line``: how long its collectives
    ran (overlapping ones counted once), and for how much of that its compute stream was busy."""
    comm = _union(s for s in line.on(rank) if s.lane.startswith("collectives"))
    compute = _union(line.on(rank, "compute"))
    hidden = sum(
        max(0, min(end, c_end) - max(start, c_start)) for start, end in comm for c_start, c_end in compute
    )
    return sum(end - start for start, end in comm), hidden


def _wrapped(model: nn.Module, kind: str, options: dict, group) -> nn.Module:
    if kind == "none":
        return model
    if group is not None:
        options = {**options, ("process_group" if kind == "torch" else "group"): group}
    return wrap(model, kind, **options)


def _step(model, kind, inputs, target, optimizer, device) -> tuple[float, float, float, float]:
    """One SGD step; ``(start, backward end, gradients synced, end)`` on ``timing.now()``'s clock."""
    synchronize(device)
    start = now()
    optimizer.zero_grad(set_to_none=True)
    output = model(*inputs).reshape(target.shape)
    nn.functional.binary_cross_entropy_with_logits(output, target).backward()
    synchronize(device)
    backward_end = now()
    if kind in ("naive", "bucketed"):
        model.finish_gradient_sync()  # naive: sends everything now; bucketed: waits for the rest
        synchronize(device)
    synced = now()
    optimizer.step()
    synchronize(device)
    return start, backward_end, synced, now()


def _message_bytes(model: nn.Module, kind: str) -> list[int]:
    if kind == "naive":
        return [p.numel() * p.element_size() for p in model.parameters()]
    if kind == "bucketed":
        return [bucket.nbytes for bucket in model.buckets]
    return compat.ddp_bucket_sizes(model)["rebuilt"] if kind == "torch" else []


def step_profile(
    variants: dict[str, tuple[str, dict]],
    config: DLRMConfig = MLPERF_DLRM,
    rows: int = 512,
    group=None,
) -> dict:
    """On every rank of ``launch(..., cluster=...)`` (of ``group``, when given): one timed SGD step
    of the DLRM ``config`` on ``rows`` rows of this rank's own, for each variant.

    ``variants``: ``{label: (kind, wrap options)}``, kind ``"none"`` (the bare model: one GPU),
    ``"naive"``, ``"bucketed"`` or ``"torch"``. Every variant starts from the same weights; the
    timed step follows the steps that rebuild the buckets (``WARMUP``: PyTorch's DDP rebuilds at
    its second forward). Returns ``{label: {"step_ns", "backward_end_ns" (from the step's start),
    "wait_ns" (by-hand kinds: waiting for the averaged gradients after backward), "messages" (bytes
    of each all-reduce: parameters, buckets), "all_reduces", "communication_ns", "hidden_ns",
    "timeline" (this rank's ``ClusterTimeline`` of the timed step)}}``.
    """
    if installed() is None:
        raise RuntimeError(
            "step_profile reads the modeled cluster's timeline: launch it with cluster=Cluster(...)"
        )
    device = rank_device()
    inputs = dlrm_batch(config, rows, seed=dist.get_rank(group), device=device)
    windows, out = {}, {}
    for label, (kind, options) in variants.items():
        model = _wrapped(config.build(seed=0).to(device), kind, options, group)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for _ in range(WARMUP[kind] + 1):
            start, backward_end, synced, end = _step(model, kind, inputs[:2], inputs[2], optimizer, device)
        ns = [round(t * 1e9) for t in (start, backward_end, synced, end)]
        windows[label] = (ns[0], ns[3])
        out[label] = {
            "step_ns": ns[3] - ns[0],
            "backward_end_ns": ns[1] - ns[0],
            "wait_ns": ns[2] - ns[1],
            "messages": _message_bytes(model, kind),
        }
    line, me = timeline(), dist.get_rank()
    for label, (start, end) in windows.items():
        step = line.window(start, end)
        calls = [
            s for s in step.on(me) if s.lane.startswith("collectives") and s.name.startswith("all_reduce")
        ]
        communication, hidden = hidden_ns(step, me)
        out[label].update(
            all_reduces=len(calls), communication_ns=communication, hidden_ns=hidden, timeline=step
        )
    return out


def step_seconds(
    variants: dict[str, tuple[str, dict]],
    width: int = 512,
    depth: int = 8,
    rows: int = 256,
    steps: int = 6,
    rounds: int = 2,
    device=None,
) -> dict:
    """On every rank (call through ``launch``): SGD steps of ``tower(width, depth)`` under each
    variant (as in ``step_profile``), ``steps`` timed after two untimed, ``rounds`` times in turn.
    ``device``: where the tower and its ``[rows, width]`` batch live, the rank's own by default;
    ``"meta"`` on a modeled cluster prices them at full size and computes nothing (the by-hand
    kinds only: PyTorch's DDP checks the parameters' shapes across ranks, which meta cannot).
    Returns ``{"seconds": {label: median step, the slowest rank's}, "bucket_bytes": {label: [bytes
    per all-reduce]}, "waits": {label: median wait after backward (by-hand kinds)}}``, and with a
    ``"none"`` variant ``"backward"``: its median forward and backward seconds."""
    mine = rank_device()
    device = torch.device(device) if device is not None else mine
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(rows, width, generator=g).to(device), torch.randn(rows, 1, generator=g).to(device)
    timed, buckets = {label: [] for label in variants}, {}
    for _ in range(rounds):
        for label, (kind, options) in variants.items():
            model = _wrapped(tower(width, depth).to(device), kind, options, None)
            timed[label] += _timed_steps(model, kind, x, y, steps, mine)
            buckets[label] = _message_bytes(model, kind)
    kinds = {label: kind for label, (kind, _) in variants.items()}
    result = {
        "seconds": {label: statistics.median(t[0] for t in ts) for label, ts in timed.items()},
        "bucket_bytes": buckets,
        "waits": {
            label: statistics.median(t[1] for t in ts)
            for label, ts in timed.items()
            if kinds[label] in ("naive", "bucketed")
        },
    }
    backward = [t[2] for label, ts in timed.items() if kinds[label] == "none" for t in ts]
    if backward:
        result["backward"] = statistics.median(backward)
    return result


def _timed_steps(model: nn.Module, kind: str, x, y, steps: int, device) -> list[tuple[float, float, float]]:
    """The probe of ``step_seconds``: ``steps`` SGD steps of ``model`` (wrapped as ``kind``) on
    ``x [rows, width]``, ``y [rows, 1]``, timed after two untimed, every rank starting each step
    together (a barrier). Per timed step: ``(step seconds, wait after backward)``, both the slowest
    rank's, then this rank's forward and backward seconds."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    timed = []
    for step in range(steps + 2):
        dist.barrier()
        start, backward_end, synced, end = _step(model, kind, (x,), y, optimizer, device)
        took = torch.tensor([end - start, synced - backward_end], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if step >= 2:
            timed.append((took[0].item(), took[1].item(), backward_end - start))
    return timed
