"""A modeled group's operations: ``Collective`` and ``Message``, the handles ``ModeledGroup`` keeps.

Each holds gloo's works for the data and for the arrival stamps that travel beside it, waits for
each work at most once (``_Waits``), and tells its ``ModeledWork`` when both are done: through
gloo's futures, completed in order on one thread per process (``_Completer``, where DDP's hooks
then run), or, where gloo has no future (sends, receives), once waited for. Their ``interval()``
is when the operation ran in virtual time (a collective's is resolved by its group).

Taught in chapter 02 (the modeled network under the real collectives), beside ``group``.
"""

from __future__ import annotations

import os
import queue
import threading
from datetime import timedelta

import torch

__all__ = ["Collective", "Message"]


def _wait(work, timeout) -> None:
    if timeout is None or (isinstance(timeout, timedelta) and timeout.total_seconds() <= 0):
        work.wait()
    else:
        work.wait(timeout)


class _Waits:
    """Waits for gloo works at most once each (a gloo send waited for twice waits for a second
    send that never comes)."""

    def __init__(self, *works):
        self.works = [w for w in works if w is not None]
        self.lock = threading.Lock()

    def wait(self, timeout) -> None:
        with self.lock:
            while self.works:
                _wait(self.works[0], timeout)
                self.works.pop(0)


class _Completer:
    """One thread per process that completes the modeled futures, in the order their operations
    finish. A future's callbacks (DDP's hooks) then run here, where they may wait for the
    stamps, and never on gloo's own worker threads, which must stay free to move them."""

    _instance = None
    _lock = threading.Lock()

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="cluster-completer", daemon=True).start()

    @classmethod
    def put(cls, job) -> None:
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
                cls._instance.pid = os.getpid()
        cls._instance.jobs.put(job)

    def _run(self) -> None:
        while True:
            self.jobs.get()()


def _when_done(futures, fn) -> None:
    """Call ``fn(None)`` once every future in ``futures`` is done (``fn(error)`` if one failed),
    on the completer thread."""

    def done(combined):
        try:
            for f in combined.value():
                f.wait()
        except BaseException as exc:
            _Completer.put(lambda error=exc: fn(error))
            return
        _Completer.put(lambda: fn(None))

    torch.futures.collect_all(futures).add_done_callback(done)


class _Operation:
    """What a collective and a message share: waiting for gloo's works once, and telling the
    handle when they are done (through their futures, or, where gloo has none, once waited)."""

    def __init__(self, stamp_work, data_work):
        self.stamp_work, self.data_work = stamp_work, data_work
        self.waits = _Waits(data_work, stamp_work)
        self.on_done = None

    def wait_data(self, timeout) -> None:
        self.waits.wait(timeout)
        if self.on_done is not None:  # no futures to tell us: done once waited for
            done, self.on_done = self.on_done, None
            done(None)

    def when_done(self, fn) -> None:
        try:
            futures = [w.get_future() for w in (self.stamp_work, self.data_work) if w is not None]
        except RuntimeError:  # "Work::getFuture not implemented": gloo's sends, receives, ...
            self.on_done = fn
            return
        _when_done(futures, fn)


class Collective(_Operation):
    """One collective of ``group``: the data's work, and ``[last arrival, longest ns]`` over the
    ranks (an all-reduce with MAX of every rank's ``[arrival, ns]``)."""

    def __init__(self, group, name: str, stamp_work, stamps: torch.Tensor, data_work):
        super().__init__(stamp_work, data_work)
        self.group, self.name, self.stamps = group, name, stamps
        self.stamp_wait = _Waits(stamp_work)
        self.start = self.end = None

    def interval(self) -> tuple[int, int]:
        """``(start, end)`` in ns: when it ran on the group's stream."""
        if self.end is None:
            self.group.resolve(self)
        return self.start, self.end


class Message(_Operation):
    """One point-to-point message; the sender knows its interval, the receiver reads it."""

    def __init__(self, group, lane: str, name: str, stamp_work, stamp, data_work, interval=None):
        super().__init__(stamp_work, data_work)
        self.group, self.lane, self.name, self.stamp = group, lane, name, stamp
        self.start, self.end = interval if interval is not None else (None, None)
        self.lock = threading.Lock()

    def interval(self) -> tuple[int, int]:
        with self.lock:
            if self.end is None:
                self.waits.wait(None)
                with self.group.clock.suspend():
                    self.start, self.end = self.stamp.tolist()
                self.group.clock.record_communication(self.lane, self.name, self.start, self.end)
        return self.start, self.end
