"""What ``work.wait()`` orders, and how to time a collective, on CPU and on CUDA.

On gloo (CPU tensors) a collective runs on gloo's threads; ``work.wait()`` blocks the calling
thread until it is done. On NCCL (CUDA tensors) the call only *enqueues* the collective on
NCCL's own CUDA stream, made to wait for the work already queued on the current stream, and
returns, even with ``async_op=False``. ``work.wait()`` then makes the *current stream* wait for
the collective's end (ProcessGroupNCCL.hpp: "let current stream wait on the completion of the
NCCL work"): later GPU work sees the result, but the host does not wait, unless
``TORCH_NCCL_BLOCKING_WAIT=1`` or ``wait(timeout)``. To read the result on the host, or to time
it, wait for the device: ``torch.cuda.synchronize()``, a ``.item()``, or CUDA events.

``wait_semantics`` shows the difference on one rank: it keeps the device busy first (a sleep on
the host for a CPU rank, a spin kernel on the GPU for a CUDA rank), then all-reduces. On CPU,
``wait()`` returns after the busy time and the work is complete; on CUDA it returns at once,
with the work not yet complete, and only the CUDA events (or a synchronize) see the time.

Taught in chapter 02 (appendix 02a, section 2); the CUDA path runs in tests/gpu/test_nccl_streams.py.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_utils.runtime import compat
from course_utils.runtime.hardware import rank_device

__all__ = ["time_on_device", "wait_semantics"]


def time_on_device(fn, device: torch.device) -> float:
    """Seconds ``fn()`` takes as the device sees it. CUDA: two ``torch.cuda.Event(enable_timing=True)``
    recorded on the current stream around ``fn`` and read after the end event completes (the
    host clock would read when the work was *queued*). CPU: the host clock."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()  # the host waits here, for the end event only
    return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def _keep_busy(device: torch.device, seconds: float, cycles_per_second: float) -> None:
    if device.type == "cuda":
        compat.gpu_sleep(int(seconds * cycles_per_second))  # queued; the host goes on at once
    else:
        time.sleep(seconds)  # a CPU rank's "device" is its host thread


def gpu_cycles_per_second(device: torch.device) -> float:
    """The rate of the spin kernel ``compat.gpu_sleep`` on ``device``, measured with CUDA events."""
    probe = 10_000_000
    compat.gpu_sleep(probe)  # warm up: the clock rises from idle
    return probe / time_on_device(lambda: compat.gpu_sleep(probe), device)


def wait_semantics(busy_s: float = 0.2, numel: int = 1 << 20) -> dict:
    """Keep this rank's device busy ``busy_s``, all-reduce ``numel`` ones with ``async_op=True``, wait.

    Returns host seconds until ``wait()`` returned (``host_wait_s``), ``is_completed()`` right
    then (``completed_at_wait``), host seconds until the value reached the host
    (``host_value_s``), the device's seconds from before the busy time to the collective's end
    (``device_s``, CUDA events on a GPU), and the value (the world size).
    """
    device = rank_device()  # this rank's GPU under NCCL, else the CPU
    rate = gpu_cycles_per_second(device) if device.type == "cuda" else 0.0
    dist.all_reduce(torch.ones(1, device=device))  # NCCL connects at its first collective: not timed
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = torch.ones(numel, device=device)
    dist.barrier()
    out = {}

    def busy_then_all_reduce():
        start = time.perf_counter()
        _keep_busy(device, busy_s, rate)
        work = dist.all_reduce(t, async_op=True)
        work.wait()  # CPU: blocks until done; CUDA: the current stream waits, the host does not
        out["host_wait_s"] = time.perf_counter() - start
        out["completed_at_wait"] = work.is_completed()
        out["start"] = start

    out["device_s"] = time_on_device(busy_then_all_reduce, device)
    out["value"] = t[0].item()  # a copy to the host: waits for the device
    out["host_value_s"] = time.perf_counter() - out.pop("start")
    return out
