"""A rank's clock in virtual time: whole nanoseconds of its modeled GPU.

The clock is the GPU's compute stream. Each operator the rank runs moves it on by its roofline
cost (``charge``); each communication runs on its own stream and the rank joins it when it
waits for it (``join``): explicitly (``work.wait()``), or implicitly when an operator first
touches a tensor the communication writes, as a GPU stream does after ``wait()``
(``wait_for_tensors``; this is how DDP's reducer, which waits inside C++, joins its buckets).

Joining communication ``[start, end]`` sets ``now = max(now + slowdown, end)``. ``slowdown``
prices overlap: compute that ran inside ``[start, end]`` (and inside no communication joined
before) ran at ``Cluster.compute_speed_during_communication`` of its speed, since NCCL's kernels
held some of the SMs; ``busy x (1/speed - 1)`` more nanoseconds, charged at the join.

A future's callback (DDP's ``fp16_compress_hook`` decompresses in one) runs on whichever thread
completes the communication. It is charged to an ``Account`` of its own, which starts when the
communication ends, whatever the thread: so every run charges it the same. Its result is ready
when the account ends, and joining it joins the communication too (``Ready``).

Integers throughout: charges add up to the same total in any order, on every machine.

Taught in chapter 02 (virtual time: how a rank's clock moves).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import weakref

import torch

from course_utils.runtime import compat
from course_utils.runtime.cluster.roofline import tensors_in
from course_utils.runtime.cluster.timeline import Span

__all__ = ["RankClock", "Account", "Ready"]


class Account:
    """The clock of a callback: starts at ``now`` (ns), moved on by what the callback runs."""

    def __init__(self, now: int):
        self.now = self.start = int(now)
        self.spent = 0


class Ready:
    """A value ready at ``ns``, computed after ``parents`` (communications) ended."""

    def __init__(self, ns: int, parents: tuple = ()):
        self.end, self.parents = int(ns), tuple(parents)

    def interval(self) -> tuple[int, int]:
        return self.end, self.end


def _merge_in(intervals: list[list[int]], start: int, end: int) -> None:
    """Add ``[start, end)`` to a sorted list of disjoint intervals, merging where they touch."""
    if end <= start:
        return
    i = bisect.bisect_left(intervals, [start, start])
    if i > 0 and intervals[i - 1][1] >= start:
        i -= 1
    j = i
    while j < len(intervals) and intervals[j][0] <= end:
        start, end = min(start, intervals[j][0]), max(end, intervals[j][1])
        j += 1
    intervals[i:j] = [[start, end]]


def _covered(intervals: list[list[int]], start: int, end: int) -> int:
    """Nanoseconds of ``[start, end)`` inside the sorted disjoint ``intervals``."""
    total = 0
    i = max(bisect.bisect_left(intervals, [start, start]) - 1, 0)
    while i < len(intervals) and intervals[i][0] < end:
        total += max(0, min(end, intervals[i][1]) - max(start, intervals[i][0]))
        i += 1
    return total


class RankClock:
    """Rank ``rank``'s virtual time under ``cluster``; see the module docstring."""

    def __init__(self, rank: int, cluster):
        self.rank = rank
        self.cluster = cluster
        self.now = 0
        self.thread = threading.get_ident()  # the rank's own thread: its compute stream
        self.lock = threading.RLock()
        self.local = threading.local()  # .account: a callback's Account; .suspended: our own bookkeeping
        self.busy: list[list[int]] = []  # compute intervals (for the overlap price)
        self.joined: list[list[int]] = []  # communication already priced for overlap
        self.compute: list[Span] = []  # the compute stream (the rank's own thread only)
        self.spans: list[Span] = []  # communication and callbacks (recorded from any thread)
        self.tags: dict[int, tuple] = {}  # storage key -> (weak ref to the tensor, communication)
        self.regions: list[str] = []
        self.lanes_free: dict[str, int] = {}  # background lanes (``in_background``): when each is free
        self.phase = {"forward": 0, "optimizer": 0}
        self.ops = self.flops = self.bytes = 0
        self.by_op: dict[str, list[int]] = {}  # "aten::addmm" -> [calls, ns, flops, bytes]
        speed = cluster.compute_speed_during_communication
        self._slow = (1 / speed - 1) if speed < 1 else 0.0

    # -- who is charging --------------------------------------------------------------------------
    def on_rank_thread(self) -> bool:
        return threading.get_ident() == self.thread and getattr(self.local, "account", None) is None

    def charges_this_thread(self) -> bool:
        """Whether operators run on this thread are charged: the rank's own thread, or a callback
        running on its account (gloo's workers inherit the dispatch mode, and are not charged)."""
        return threading.get_ident() == self.thread or getattr(self.local, "account", None) is not None

    def current(self) -> int:
        """The time on this thread's clock: a callback's account, else the compute stream."""
        account = getattr(self.local, "account", None)
        return account.now if account is not None else self.now

    @property
    def suspended(self) -> bool:
        return getattr(self.local, "suspended", False)

    @contextlib.contextmanager
    def suspend(self):
        """Operators run here (the process group's own bookkeeping) cost nothing."""
        before = self.suspended
        self.local.suspended = True
        try:
            yield
        finally:
            self.local.suspended = before

    @contextlib.contextmanager
    def on_account(self, account: Account):
        """Charge what runs here, on this thread, to ``account`` (a callback's own clock)."""
        from course_utils.runtime.cluster.mode import ChargeMode

        before = getattr(self.local, "account", None)
        self.local.account = account
        mode = None if threading.get_ident() == self.thread else ChargeMode(self)
        try:
            if mode is None:
                yield account
            else:
                with mode:
                    yield account
        finally:
            self.local.account = before

    # -- compute ---------------------------------------------------------------------------------
    def label(self) -> str:
        """The name of what runs now: the innermost ``region``, else the phase of the step."""
        if self.regions:
            return self.regions[-1]
        if compat.in_autograd_backward():
            return "backward"
        if self.phase["optimizer"]:
            return "optimizer"
        if self.phase["forward"]:
            return "forward"
        return "compute"

    def charge(self, cost) -> None:
        """Move this thread's clock on by one operator's ``cost`` (a ``roofline.Cost``)."""
        account = getattr(self.local, "account", None)
        with self.lock:
            self.ops += 1
            self.flops += cost.flops
            self.bytes += cost.bytes
            tally = self.by_op.setdefault(getattr(cost, "op", ""), [0, 0, 0, 0])
            tally[0] += 1
            tally[1] += cost.ns
            tally[2] += cost.flops
            tally[3] += cost.bytes
            if account is not None:
                start = account.now
                account.now += cost.ns
                account.spent += cost.ns
                return
            start = self.now
            self.now += cost.ns
            _merge_in(self.busy, start, self.now)
            self.record_compute(self.label(), start, self.now)

    def busy_until(self, start: int, end: int) -> None:
        """The compute stream was busy over ``[start, end)`` (for the overlap price)."""
        _merge_in(self.busy, start, end)

    def record_compute(self, name: str, start: int, end: int) -> None:
        """Add a compute span, extending the last one if it continues it under the same name."""
        last = self.compute[-1] if self.compute else None
        if last is not None and last.name == name and last.end_ns == start:
            self.compute[-1] = Span(self.rank, "compute", name, last.start_ns, end)
        else:
            self.compute.append(Span(self.rank, "compute", name, start, end))

    def all_spans(self) -> list[Span]:
        """Every span so far (compute, communication, callbacks), each lane in time order."""
        with self.lock:
            return list(self.compute) + list(self.spans)

    def record_communication(self, lane: str, name: str, start: int, end: int) -> None:
        with self.lock:
            self.spans.append(Span(self.rank, lane, name, start, end))

    # -- waiting for communication -----------------------------------------------------------
    def join(self, waited) -> None:
        """This thread waits for ``waited`` (a communication, or a ``Ready`` value)."""
        start, end = waited.interval()
        account = getattr(self.local, "account", None)
        if account is not None or threading.get_ident() != self.thread:
            if account is not None:
                account.now = max(account.now, end)
            return
        for parent in getattr(waited, "parents", ()):
            self.join(parent)
        with self.lock:
            slowdown = 0
            if self._slow and not isinstance(waited, Ready):
                overlapped = _covered(self.busy, start, end) - self._overlap_already_priced(start, end)
                slowdown = round(max(overlapped, 0) * self._slow)
                _merge_in(self.joined, start, end)
            if slowdown:
                self.record_compute("slowed by communication", self.now, self.now + slowdown)
                _merge_in(self.busy, self.now, self.now + slowdown)
            self.now = max(self.now + slowdown, end)

    def _overlap_already_priced(self, start: int, end: int) -> int:
        """Compute inside ``[start, end)`` that an earlier join already slowed."""
        total = 0
        i = max(bisect.bisect_left(self.joined, [start, start]) - 1, 0)
        while i < len(self.joined) and self.joined[i][0] < end:
            a, b = max(start, self.joined[i][0]), min(end, self.joined[i][1])
            if b > a:
                total += _covered(self.busy, a, b)
            i += 1
        return total

    # -- tensors that communication writes -------------------------------------------------------
    def tag(self, tensors, waited) -> None:
        """Operators that touch ``tensors`` later wait for ``waited`` first."""
        with self.lock:
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    self.tags[compat.storage_key(t)] = (weakref.ref(t), waited)

    def wait_for_tensors(self, args, kwargs) -> None:
        """Join every communication that writes a tensor among ``args``/``kwargs``."""
        for t in tensors_in((args, kwargs)):
            key = compat.storage_key(t)
            with self.lock:
                entry = self.tags.get(key)
            if entry is None:
                continue
            ref, waited = entry
            if ref() is None:
                with self.lock:
                    self.tags.pop(key, None)
                continue
            self.join(waited)
            if self.on_rank_thread():
                with self.lock:
                    if self.tags.get(key) is entry:
                        del self.tags[key]
