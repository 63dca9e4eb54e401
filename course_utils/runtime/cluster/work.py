"""The handles a modeled group's operations return: real completion, virtual time.

* ``ModeledWork``: ``wait()`` waits for gloo to move the bytes (real), then joins the rank's clock
  to the operation's end (virtual). ``get_future()`` gives a ``ModeledFuture``.
* ``ModeledFuture``: a ``torch.futures.Future`` whose callbacks (``then``) are charged to an
  ``Account`` of their own that starts when the operation ends, on whatever thread runs them:
  DDP's communication hooks cost the same on every run. The value a callback returns is ready
  when its account ends; a later operator that touches it waits for that (``Ready``).

Taught in chapter 02 (virtual time: what ``wait()`` does).
"""

from __future__ import annotations

import torch

from course_utils.runtime import compat
from course_utils.runtime.cluster.clock import Account, Ready
from course_utils.runtime.cluster.roofline import tensors_in

__all__ = ["ModeledWork", "ModeledFuture"]


class ModeledFuture(torch.futures.Future):
    """A future ready when ``waited`` (a communication or a ``Ready``) is, on ``clock``."""

    def __init__(self, clock, waited=None):
        super().__init__()
        self._clock = clock
        self._waited = waited

    def then(self, callback):
        """``callback(self)`` once this future is done, charged to its own account (module
        docstring); returns the future of its result."""
        child = ModeledFuture(self._clock)

        def run(done):
            try:
                start = self._waited.interval()[1] if self._waited is not None else self._clock.current()
                account = Account(start)
                with self._clock.on_account(account):
                    value = callback(done)
            except BaseException as exc:  # the callback's error, raised again by the child's wait()
                child.set_exception(exc)
                return
            if account.spent:
                self._clock.record_communication("callbacks", "callback", account.start, account.now)
            ready = Ready(account.now, (self._waited,) if self._waited is not None else ())
            child._waited = ready
            self._clock.tag(tensors_in(value), ready)
            child.set_result(value)

        self.add_done_callback(run)
        return child

    def wait(self):
        value = super().wait()
        if self._waited is not None:
            self._clock.join(self._waited)
        return value


class ModeledWork(compat.WORK_BASE):
    """The handle of one operation ``comm`` (``operations.Collective`` or ``operations.Message``)."""

    def __init__(self, clock, comm, result: list[torch.Tensor]):
        super().__init__()
        self.clock = clock
        self.comm = comm
        self.result_ = result
        self.future_ = ModeledFuture(clock, comm)
        comm.when_done(self._finish)

    def _finish(self, error) -> None:
        if error is None:
            self.future_.set_result(self.result_)
        else:
            self.future_.set_exception(error)

    def wait(self, timeout=None) -> bool:
        with self.clock.suspend():  # gloo may copy results into place on this thread: not the GPU's work
            self.comm.wait_data(timeout)
        self.clock.join(self.comm)
        return True

    def is_completed(self) -> bool:
        return self.future_.done()

    def is_success(self) -> bool:
        return self.future_.done()

    def result(self) -> list[torch.Tensor]:
        with self.clock.suspend():
            self.comm.wait_data(None)
        return self.result_

    def get_future(self) -> torch.futures.Future:
        return self.future_
