"""The handles a wire's operations return, and the sleeping threads that complete them.

* ``WireWork``: the ``Work`` of one operation, done when its future is completed;
* ``Lane``: one queue of operations, finished in order by one daemon thread that sleeps until
  each one's deadline (so waiting costs no CPU);
* ``sleep_until(deadline)``: sleep to a monotonic time.

Taught in chapter 02 (how the wire completes an operation on the model's time).
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from course_utils.runtime import compat

__all__ = ["WireWork", "Lane", "sleep_until"]


def sleep_until(deadline: float) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


class WireWork(compat.WORK_BASE):
    """The handle one operation returns: done when the lane thread completes its future."""

    def __init__(self, result: list[torch.Tensor]):
        super().__init__()
        self.result_ = result
        self.future_ = torch.futures.Future()

    def wait(self, timeout=None) -> bool:
        self.future_.wait()  # raises the operation's error, if it failed
        return True

    def is_completed(self) -> bool:
        return self.future_.done()

    def is_success(self) -> bool:
        return self.future_.done()

    def result(self) -> list[torch.Tensor]:
        self.future_.wait()
        return self.result_

    def get_future(self) -> torch.futures.Future:
        return self.future_


class Lane:
    """One queue of operations, finished in order by one sleeping daemon thread."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.free_at = 0.0  # when the link finishes what it was given (monotonic seconds)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def stop(self) -> None:
        self.jobs.put(None)
