"""DDP communication hooks: send fewer bytes per step (fp16 / bf16 compression, PowerSGD).

A communication hook replaces what DDP does with each gradient bucket (by default: divide by
the world size, all-reduce, ``default_hooks.allreduce_hook``). ``model.register_comm_hook(state,
hook)``, before the first step, with a hook from ``torch.distributed.algorithms.ddp_comm_hooks``:

* ``fp16_compress_hook`` / ``bf16_compress_hook``: cast the bucket to 16 bits, all-reduce, cast
  back into the float32 bucket: half the bytes, at the price of the gradients' low bits
  (bfloat16 keeps float32's range and 8 bits of mantissa; float16 10 bits and a narrow range).
  torch refuses to register ``bf16_compress_hook`` on a torch built without CUDA and NCCL 2.10
  (``DistributedDataParallel._check_comm_hook`` checks the build, by the hook's name, not the
  group's backend); ``bf16_hook`` here does the same cast and runs on every build and backend.
* ``powerSGD_hook`` (Vogels et al., NeurIPS 2019): each ``n x m`` gradient matrix is sent as two
  thin factors, ``P [n, r]`` and ``Q [m, r]``, all-reduced one after the other, with the error of
  the approximation kept locally and added to the next step's gradient (error feedback). Bytes
  per matrix: ``4 r (n + m)`` instead of ``4 n m``; vectors (biases) and, before
  ``start_powerSGD_iter``, everything go uncompressed.

``tap_all_reduce`` counts the bytes each ``dist.all_reduce`` call of this process is given (every
hook above sends through it), so a run reports what went on the network, exactly. ``hook_traffic``
trains the dense part of MLPerf's DLRM under each hook and returns those bytes and the step
times; on a modeled cluster (``launch(..., cluster=...)``) the times are the modeled GPUs' and
network's, exact, and a hook's callback (fp16's decompression) is charged as the cluster charges
callbacks. PowerSGD is not timed there: its callback starts the next all-reduce and waits for it,
and the cluster runs callbacks at ``wait()`` on the rank's own thread, so that inner wait would
never end; ``hook_traffic`` refuses it on a cluster, and counts its bytes on plain gloo. There
each bucket's exchange finishes before backward goes on (``in_bucket_order``): on gloo a future's
callbacks run on gloo's own thread, so PowerSGD's callback would start its next all-reduce there
while backward starts the next bucket's from the rank's thread, in an order that can differ
between ranks (gloo then aborts on a size mismatch). NCCL's futures run them on the calling thread.

Taught in chapter 04 (appendix 04a, section 3).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from course_utils.ddp.overlap import MLPERF_DLRM, dlrm_batch, hidden_ns
from course_utils.runtime.cluster import installed, timeline
from course_utils.runtime.taps import tap_collectives
from course_utils.runtime.timing import now
from course_utils.workload.models import DLRMConfig

__all__ = ["bf16_hook", "in_bucket_order", "HOOKS", "tap_all_reduce", "powersgd_bytes", "hook_traffic"]


def bf16_hook(process_group, bucket):
    """``bf16_compress_hook``'s work on any build: the bucket cast to bfloat16 and divided by the
    world size, all-reduced, written back into the float32 bucket. (No annotations: DDP checks
    them against ``dist.GradBucket``.)"""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return future.then(decompress)


def in_bucket_order(hook):
    """``hook``, with each bucket's whole exchange (every collective its callbacks start) finished
    before it returns: the ranks then issue the collectives in the same order, bucket after bucket,
    wherever the backend runs a future's callbacks. Returns a completed future of the bucket."""

    def ordered(state, bucket):
        done = torch.futures.Future()
        done.set_result(hook(state, bucket).wait())
        return done

    return ordered


def _powersgd(rank: int):
    def make():
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2, use_error_feedback=True
        )
        return state, in_bucket_order(powerSGD_hook.powerSGD_hook)

    return make


#: name -> a function returning (state, hook) for ``register_comm_hook``
HOOKS = {
    "float32 (DDP's default)": lambda: (None, default_hooks.allreduce_hook),
    "fp16_compress_hook": lambda: (None, default_hooks.fp16_compress_hook),
    "bf16 (bf16_hook)": lambda: (None, bf16_hook),
    "PowerSGD, rank 1": _powersgd(1),
}


def tap_all_reduce(calls: list):
    """Within the block, append the bytes of every tensor given to ``dist.all_reduce`` (in this
    process) to ``calls``; the call itself is unchanged (``runtime.taps.tap_collectives``). (DDP's
    hooks call ``dist.all_reduce`` through the module, so the tap sees them; DDP's built-in C++
    all-reduce does not.)"""
    return tap_collectives(all_reduce=calls)


def powersgd_bytes(model: nn.Module, rank: int, min_compression_rate: float = 2) -> int:
    """What PowerSGD sends per step once compressing, by the formula: ``4 r (n + m)`` bytes per
    ``[n, m]`` float32 matrix worth compressing (``r (n + m) x min_compression_rate < n m``, torch's
    ``_should_compress`` rule), ``4 n m`` per other matrix and ``4 n`` per vector (sent as is)."""
    total = 0
    for p in model.parameters():
        n, m = p.shape[0], p[0].numel() if p.dim() > 1 else 1
        compress = p.dim() > 1 and rank * (n + m) * min_compression_rate < n * m
        total += 4 * (rank * (n + m) if compress else n * m)
    return total


def hook_traffic(
    names=tuple(HOOKS), config: DLRMConfig = MLPERF_DLRM, rows: int = 512, steps: int = 2
) -> dict:
    """On every rank (call through ``launch``, with ``cluster=`` to time it): SGD steps of the DLRM
    ``config`` (``overlap.MLPERF_DLRM``: the dense part of MLPerf's DLRM) on ``rows`` rows of this
    rank, under PyTorch's DDP with each hook of ``names``. Two steps first, not counted (the buckets
    are rebuilt at the second; PowerSGD compresses from the third), then ``steps`` counted.

    Returns ``{name: {"bytes": bytes given to all_reduce per step, "calls": all-reduces per step,
    "sizes": the bytes of each all-reduce of the last step, "step_ns": the last step (virtual time
    on a modeled cluster, else wall time, in ns), "communication_ns" and "hidden_ns" of the last
    step and its "timeline" (a modeled cluster only: ``overlap.hidden_ns``), "weights": this rank's
    flat parameters}}``.
    """
    if installed() is not None and any(name.startswith("PowerSGD") for name in names):
        raise ValueError(
            "PowerSGD cannot be timed on a modeled cluster (its callback waits for another "
            "all-reduce): launch it without cluster= to count its bytes"
        )
    dense, sparse, label = dlrm_batch(config, rows, seed=dist.get_rank())
    out = {}
    for name in names:
        model = DistributedDataParallel(config.build(seed=0))
        model.register_comm_hook(*HOOKS[name]())
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        calls = []
        for step in range(steps + 2):
            start, before = now(), len(calls)
            with tap_all_reduce(calls):
                nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), label).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            end = now()
            if step < 2:
                del calls[before:]
        per_step = len(calls) // steps
        out[name] = {
            "bytes": sum(calls) // steps,
            "calls": per_step,
            "sizes": calls[-per_step:],
            "step_ns": round((end - start) * 1e9),
            "weights": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        }
        if installed() is not None:
            window = timeline().window(round(start * 1e9), round(end * 1e9))
            communication, hidden = hidden_ns(window, dist.get_rank())
            out[name].update(communication_ns=communication, hidden_ns=hidden, timeline=window)
    dist.barrier()  # every rank's hooks done before any rank returns and its group is torn down
    return out
