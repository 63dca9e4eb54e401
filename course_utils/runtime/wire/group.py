"""``WireGroup``: a process group that moves bytes with gloo and finishes on the wire's time.

A Python ``dist.ProcessGroup`` subclass, registered with ``dist.Backend.register_backend`` as
the backend ``"wire"``. Each operation goes to an inner gloo group exactly as it would without
a wire (same bytes, same results, bit for bit), and the ``Work`` it returns completes at

    ``max(gloo's own completion, start + the model's seconds)``,

where ``start`` is when the last rank arrived, or when this rank's link finished the operation
before (one link per rank: operations queue, as they do on one NCCL stream). Ranks on one
machine share one monotonic clock and its memory, so arrival times compare across processes;
they go through a small table in shared memory (``stamps``) and never touch the data.

* collectives: every rank writes ``[arrival, model seconds]`` before it hands the operation to
  gloo, and reads every rank's once gloo has completed it; all ranks then agree on ``start``
  and ``end``. The model's seconds are the larger over ranks (an all-to-all's ranks send
  different amounts).
* send/recv: the sender's link starts the message at ``max(post, link free)`` and writes that
  time for the receiver; the message arrives ``alpha + n/beta`` later. Each direction to each
  peer is its own queue (so a stage's sends never wait behind its receives).

One "lane" thread per queue finishes the operations in order; it sleeps, so waiting costs no CPU.
DDP's reducer, ``async_op=True`` handles, the course's ring and pipeline executor all go
through here. Limits: ``batch_isend_irecv`` degrades to single sends and receives (no
coalescing on a Python group); ``monitored_barrier`` and ``recv`` from any source are gloo's
alone and are refused.

Taught in chapter 02 (the wire under the real collectives) and chapter 04 (DDP's overlap).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from course_utils.runtime import compat
from course_utils.runtime.wire.model import Wire, collective_seconds
from course_utils.runtime.wire.stamps import Stamps
from course_utils.runtime.wire.work import Lane, WireWork, sleep_until

__all__ = ["WireGroup"]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class WireGroup(dist.ProcessGroup):
    """A process group of ``size`` ranks over gloo, each operation timed by ``wire``.

    ``global_ranks``: the world ranks of this group's members, in group order (the two-tier
    model asks which node each one is on).
    """

    def __init__(self, store, rank: int, size: int, timeout, wire: Wire, global_ranks: list[int]):
        super().__init__(rank, size)
        self.wire = wire
        self.global_ranks = list(global_ranks)
        self.inner = dist.ProcessGroupGloo(dist.PrefixStore("data", store), rank, size, timeout)
        self.stamps = Stamps(store, rank, size, timeout)
        self.counts: dict[object, int] = {}  # operations posted: collectives, and per message pair
        self.send_free_at: dict[int, float] = {}  # when this rank's link to each peer is free
        # What this class does not override (C++ helpers DDP calls) goes straight to gloo, untimed.
        compat.register_cpu_backend(self, self.inner)
        self.lanes: dict[object, Lane] = {}
        self.lanes_lock = threading.Lock()

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "wire"

    def _count(self, key) -> int:
        """This operation's number among those of ``key`` (same on every rank: posted in order)."""
        with self.lanes_lock:
            count = self.counts.get(key, 0)
            self.counts[key] = count + 1
            return count

    def _lane(self, key) -> Lane:
        with self.lanes_lock:
            if key not in self.lanes:
                self.lanes[key] = Lane(f"wire-{key}")
            return self.lanes[key]

    # -- the two timings ---------------------------------------------------------------------
    def _collective(
        self, op: str, nbytes: float, result: list[torch.Tensor], issue: Callable, part_bytes: float = 0.0
    ) -> WireWork:
        """Issue ``issue()`` (the gloo call) and finish it on the model's time for ``op``."""
        alpha, beta = self.wire.link(self.global_ranks)
        model = collective_seconds(op, nbytes, self.size(), alpha, beta, part_bytes)
        count = self._count("collectives")
        self.stamps.arrive(count, self.rank(), time.monotonic(), model)
        data_work = issue()

        def deadline(lane: Lane) -> float:  # every rank has arrived, and written its stamp
            last_arrival, seconds = self.stamps.last_arrival(count)
            lane.free_at = max(last_arrival, lane.free_at) + seconds
            return lane.free_at

        return self._complete("collectives", data_work, result, deadline)

    def _complete(self, lane_key, data_work, result: list[torch.Tensor], deadline: Callable) -> WireWork:
        """A ``WireWork`` that lane ``lane_key`` completes with ``result``: once gloo's ``data_work``
        is done, at ``deadline(lane)`` (monotonic seconds, computed then, in the lane's order)."""
        work = WireWork(result)
        lane = self._lane(lane_key)

        def finish():
            try:
                data_work.wait()
                sleep_until(deadline(lane))
            except BaseException as exc:  # the gloo error, raised again by wait()
                work.future_.set_exception(exc)
                return
            work.future_.set_result(result)

        lane.jobs.put(finish)
        return work

    def _message_seconds(self, tensors, peer: int) -> float:
        alpha, beta = self.wire.link([self.global_ranks[self.rank()], self.global_ranks[peer]])
        return collective_seconds("send", _nbytes(tensors), 2, alpha, beta)

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors, opts):
        return self._collective(
            "all_reduce", _nbytes(tensors), tensors, lambda: self.inner.allreduce(tensors, opts)
        )

    def allreduce_coalesced(self, tensors, opts):
        return self._collective(
            "all_reduce", _nbytes(tensors), tensors, lambda: self.inner.allreduce_coalesced(tensors, opts)
        )

    def broadcast(self, tensors, opts):
        return self._collective(
            "broadcast", _nbytes(tensors), tensors, lambda: self.inner.broadcast(tensors, opts)
        )

    def reduce(self, tensors, opts):
        return self._collective("reduce", _nbytes(tensors), tensors, lambda: self.inner.reduce(tensors, opts))

    def allgather(self, output_lists, inputs, opts):
        outputs = [t for out in output_lists for t in out]
        return self._collective(
            "all_gather", _nbytes(outputs), outputs, lambda: self.inner.allgather(output_lists, inputs, opts)
        )

    def _allgather_base(self, output, input, opts):
        return self._collective(
            "all_gather",
            _nbytes([output]),
            [output],
            lambda: compat.backend_all_gather_into_tensor(self.inner, output, input, opts),
        )

    def reduce_scatter(self, outputs, input_lists, opts):
        inputs = [t for ins in input_lists for t in ins]
        return self._collective(
            "reduce_scatter",
            _nbytes(inputs),
            outputs,
            lambda: self.inner.reduce_scatter(outputs, input_lists, opts),
        )

    def _reduce_scatter_base(self, output, input, opts):
        return self._collective(
            "reduce_scatter",
            _nbytes([input]),
            [output],
            lambda: compat.backend_reduce_scatter_tensor(self.inner, output, input, opts),
        )

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        w, me = self.size(), self.rank()
        row_bytes = (input.numel() // max(input.shape[0], 1)) * input.element_size() if input.dim() else 0
        sent = _split_bytes(input.shape[0] if input.dim() else 0, input_split_sizes, w, me) * row_bytes
        out_rows = output.shape[0] if output.dim() else 0
        received = _split_bytes(out_rows, output_split_sizes, w, me) * row_bytes
        return self._collective(
            "all_to_all",
            max(sent, received),
            [output],
            lambda: self.inner.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts),
        )

    def alltoall(self, outputs, inputs, opts):
        me = self.rank()
        sent = _nbytes([t for j, t in enumerate(inputs) if j != me])
        received = _nbytes([t for j, t in enumerate(outputs) if j != me])
        return self._collective(
            "all_to_all", max(sent, received), outputs, lambda: self.inner.alltoall(outputs, inputs, opts)
        )

    def gather(self, output_lists, inputs, opts):
        outputs = [t for out in output_lists for t in out]
        return self._collective(
            "gather", 0, outputs, lambda: self.inner.gather(output_lists, inputs, opts), _nbytes(inputs)
        )

    def scatter(self, outputs, input_lists, opts):
        return self._collective(
            "scatter", 0, outputs, lambda: self.inner.scatter(outputs, input_lists, opts), _nbytes(outputs)
        )

    def barrier(self, opts=None):
        return self._collective("barrier", 0, [], lambda: self.inner.barrier(opts or dist.BarrierOptions()))

    def monitored_barrier(self, *args, **kwargs):
        raise RuntimeError(
            "monitored_barrier is gloo's alone and this group is a wire over gloo: use dist.barrier, "
            "or launch without wire= for this cell"
        )

    # -- point to point ------------------------------------------------------------------------
    def send(self, tensors, dst: int, tag: int = 0):
        me = self.rank()
        seconds = self._message_seconds(tensors, dst)
        count = self._count(("message", me, dst, tag))
        with self.lanes_lock:  # the link's queue depends on this rank's own sends only
            start = max(time.monotonic(), self.send_free_at.get(dst, 0.0))
            self.send_free_at[dst] = end = start + seconds
        self.stamps.start_message(me, dst, tag, count, start)
        data_work = self.inner.send(tensors, dst, tag)
        return self._complete(("send", dst), data_work, tensors, lambda lane: end)

    def recv(self, tensors, src: int, tag: int = 0):
        post = time.monotonic()
        seconds = self._message_seconds(tensors, src)
        count = self._count(("message", src, self.rank(), tag))
        data_work = self.inner.recv(tensors, src, tag)

        def deadline(lane: Lane) -> float:  # the sender has posted it, and written its link's start
            return max(post, self.stamps.message_started(src, self.rank(), tag, count) + seconds)

        return self._complete(("recv", src), data_work, tensors, deadline)

    def recv_anysource(self, tensors, tag: int = 0):
        raise RuntimeError(
            "recv from any source is not modelled on a wire (the sender is unknown until the bytes "
            "arrive): pass src= to dist.recv, or launch without wire="
        )

    # -- teardown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        with self.lanes_lock:
            for lane in self.lanes.values():
                lane.stop()
            self.lanes.clear()
        if hasattr(self.inner, "shutdown"):
            self.inner.shutdown()

    def abort(self) -> None:
        self.shutdown()


def _split_bytes(rows: int, split_sizes: list[int], world: int, me: int) -> int:
    """Rows of a flat all-to-all tensor that cross to other ranks (equal splits when none given)."""
    if split_sizes:
        return rows - split_sizes[me]
    return rows - rows // world
