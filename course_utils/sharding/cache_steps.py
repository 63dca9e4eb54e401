"""Step time of a DLRM whose tables live in host memory behind device caches, on a modeled GPU.

Every table ``t`` keeps ``capacity(N_t, load_factor, batch)`` rows on the device (an
``LRUCache``) and all ``N_t`` in host memory. A step's rows that miss are copied from the host
over the GPU's host link, here the cluster's ``pcie`` preset (PCIe Gen5 x16, 64 GB/s each way),
priced as one message: ``alpha + bytes / beta`` (``network.collective_seconds("send", ...)``).

* ``miss_counts``: rows each step copies in, counted by running the caches on real ids;
* ``step_compute_seconds``: the step's own compute (forward, backward, SGD on the MLPs and on the
  rows used), a DLRM on the ``meta`` device priced by the roofline once (``timed_on``): its lookups
  read the cache's slots, so its cost does not depend on how many rows the host holds;
* ``modeled_steps``: the steps in virtual time. Without prefetch a step first copies its missing
  rows, then computes (the copy is on the critical path, as in FBGEMM's cache populated inside
  the forward). With prefetch, the copy of step ``s + 1``'s rows runs on the host link's lane
  (``in_background``) while step ``s`` computes, and step ``s + 1`` waits only for what is left of
  it: TorchRec's ``PrefetchTrainPipelineSparseDist``, which prefetches the next batch into
  FBGEMM's cache on a separate CUDA stream during the current forward and backward.

The rows evicted go back to the host over the link's other direction (PCIe is full duplex), as
many as came in; they are not on the step's path and are not priced here.

Taught in chapter 07 (appendix 07d, memory tiers).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from course_utils.runtime import cluster as modeled
from course_utils.runtime.cluster import Cluster, collective_seconds
from course_utils.sharding.cache import LRUCache, capacity
from course_utils.workload.models import DLRM

__all__ = ["miss_counts", "host_copy_seconds", "step_compute_seconds", "modeled_steps"]


def miss_counts(ids: torch.Tensor, cardinalities, load_factor: float, batch: int) -> np.ndarray:
    """``[steps]`` int64: rows copied in at each step, all tables together, for ids ``[S, T]``
    looked up ``batch`` rows a step through one cache per table (no row data: counts only)."""
    caches = [LRUCache(torch.empty(n, 0), capacity(n, load_factor, batch)) for n in cardinalities]
    steps = ids.split(batch)
    return np.array([sum(c.prefetch(b[:, t]) for t, c in enumerate(caches)) for b in steps], dtype=np.int64)


def host_copy_seconds(rows: int, dim: int, gpu: Cluster, bytes_per_value: int = 4) -> float:
    """Seconds to copy ``rows`` rows of ``dim`` values from host memory over ``gpu``'s link."""
    if rows == 0:
        return 0.0
    link = gpu.network
    return collective_seconds("send", rows * dim * bytes_per_value, 1, link.latency_s, link.bandwidth_Bps)


def step_compute_seconds(rows, dim: int, batch: int, gpu: Cluster, n_dense: int = 13) -> float:
    """Modeled seconds of one training step of a DLRM with tables of ``rows`` rows, on the
    ``meta`` device: forward, backward, SGD on the MLPs, and each table's looked-up rows updated
    in place (``index_add_``, as a fused optimizer does); the second of two steps, priced."""
    lr = 0.01
    with torch.device("meta"):
        model = DLRM(rows, n_dense=n_dense, embedding_dim=dim)
        dense, label = torch.empty(batch, n_dense), torch.empty(batch)
        sparse = torch.zeros(batch, len(rows), dtype=torch.int64)
    sgd = torch.optim.SGD(model.dense_parameters(), lr=lr)
    with modeled.timed_on(gpu):
        for step in range(2):
            if step == 1:
                first = modeled.modeled_ns()
            sgd.zero_grad()
            with torch.no_grad():
                pooled = model.embed(sparse)
            pooled.requires_grad_()
            logit = model.interact_and_predict(model.bottom(dense), pooled)
            F.binary_cross_entropy_with_logits(logit, label).backward()
            sgd.step()
            with torch.no_grad():
                for t, bag in enumerate(model.embeddings):
                    bag.weight.index_add_(0, sparse[:, t], pooled.grad[:, t], alpha=-lr)
        second = modeled.modeled_ns() - first
    return second / 1e9


def modeled_steps(compute_s: float, copy_s, gpu: Cluster, prefetch: bool):
    """``(step_ns [S] int64, timeline)``: steps of ``compute_s`` each after copies of ``copy_s
    [S]`` seconds (module docstring); a step ends when its compute does."""
    step_ns = []
    with modeled.timed_on(gpu):
        pending = modeled.in_background(copy_s[0], "rows in, step 0", lane="host link") if prefetch else None
        for s, copy in enumerate(copy_s):
            start = modeled.modeled_ns()
            if prefetch:
                pending.wait()  # this step's rows, copied during the step before
                if s + 1 < len(copy_s):
                    pending = modeled.in_background(copy_s[s + 1], f"rows in, step {s + 1}", lane="host link")
            else:
                modeled.spend(copy, f"rows in, step {s}")
            modeled.spend(compute_s, f"step {s}")
            step_ns.append(modeled.modeled_ns() - start)
        timeline = modeled.timeline()
    return np.array(step_ns, dtype=np.int64), timeline
