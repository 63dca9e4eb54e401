"""Timing work that may run on a GPU: wall time only after the device has finished.

A CUDA kernel launch returns at once and the GPU works on afterwards, so
``time.perf_counter()`` around GPU code measures how long it took to *queue* the
work, not to do it. Two correct ways, both here:

* ``Stopwatch(*devices)``: synchronise the devices before reading the clock, at
  the start and at the end. Simple, right for a whole step; but a device-wide
  synchronise also waits for other streams (say, a communication kernel).
  It reads the process's CPU time too (``cpu_seconds``). Without devices it is
  the course's plain stopwatch (chapter 01 times training with it).
* ``CudaSpan``: CUDA events recorded on the current stream around the work,
  read after a later synchronise. Times what that stream did, no more, and does
  not stall the host in between: right for the pieces of a pipeline step.

On the CPU both reduce to plain ``time.perf_counter``. Every timed path of the
course uses one of them, or ``now()``.

In a rank of a modeled cluster (``launch(fn, cluster=...)``) all of them read the rank's
virtual clock instead (``now()``: ``cluster.modeled_time()``, the modeled GPU's compute stream),
so the same code measures the modeled cluster, exactly, whatever this machine is doing.

Taught in chapters 01 to 06 (``Stopwatch`` in 01 and 05, ``synchronize`` in 03, ``CudaSpan`` in 06).
"""

from __future__ import annotations

import time

import torch

from course_utils.runtime import cluster


def now() -> float:
    """Seconds on this process's clock: the modeled GPU's (virtual time) in a rank of a modeled
    cluster, else ``time.perf_counter()``."""
    return cluster.modeled_time() if cluster.installed() is not None else time.perf_counter()


def synchronize(*devices: torch.device | str | None) -> None:
    """Wait until every CUDA device among ``devices`` has finished its queued work (CPU: no-op)."""
    for device in devices:
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class Stopwatch:
    """Wall time of a block, ``seconds``, with ``devices`` synchronised at both ends, and the
    process's ``cpu_seconds`` (all its threads; on a busy machine wall time grows, CPU time less).

    >>> with Stopwatch(torch.device("cpu")) as watch:
    ...     pass
    >>> watch.seconds >= 0 and watch.cpu_seconds >= 0
    True
    """

    def __init__(self, *devices: torch.device | str | None):
        self.devices = devices
        self.seconds = self.cpu_seconds = float("nan")

    def __enter__(self) -> Stopwatch:
        synchronize(*self.devices)
        self._start, self._cpu_start = now(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(*self.devices)
        self.seconds = now() - self._start
        self.cpu_seconds = time.process_time() - self._cpu_start


def timed(fn, *args, devices=(), **kwargs) -> tuple:
    """``(fn(*args, **kwargs), seconds)``, the devices synchronised before and after."""
    with Stopwatch(*devices) as watch:
        result = fn(*args, **kwargs)
    return result, watch.seconds


class CudaSpan:
    """Start and end of work on ``device``'s current stream, in ms since ``origin``.

    On CUDA it records two events on the stream (no host stall); ``interval()``
    synchronises on the end event and reads both. On the CPU it reads the clock
    at ``start()`` and ``end()``. ``origin`` is a ``CudaSpan`` whose ``start`` is
    the zero of the timeline (None: this span's own start is zero).
    """

    def __init__(self, device: torch.device, origin: CudaSpan | None = None):
        self.cuda = torch.device(device).type == "cuda"
        self.origin = origin

    def _mark(self):
        if not self.cuda:
            return now()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> CudaSpan:
        self._start = self._mark()
        return self

    def end(self) -> CudaSpan:
        self._end = self._mark()
        return self

    def _ms(self, mark) -> float:
        zero = (self.origin or self)._start
        if self.cuda:
            return zero.elapsed_time(mark) if mark is not zero else 0.0
        return (mark - zero) * 1e3

    def interval(self) -> tuple[float, float]:
        """``(start ms, end ms)`` relative to the origin's start."""
        if self.cuda:
            self._end.synchronize()
        return self._ms(self._start), self._ms(self._end)
