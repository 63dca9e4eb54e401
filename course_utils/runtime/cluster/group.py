"""``ModeledGroup``: a process group whose bytes gloo moves and whose time the network model sets.

A Python ``dist.ProcessGroup`` subclass, registered as the backend ``"cluster"``. Every
operation goes to an inner gloo group exactly as it would without the cluster (same bytes, same
results, bit for bit; on ``meta`` tensors nothing moves), and is timed in virtual time:

* a collective starts when the last rank arrives, and after the collective before it on this
  group (one stream per group, as NCCL has one per communicator), and lasts what the network
  model says (``network.collective_seconds``; an all-to-all, the busiest rank's share);
* a message starts when the sender posts it, after the sender's previous message to the same
  peer (one queue per peer and direction), and arrives ``alpha + n/beta`` later.

Arrival times travel beside the data, on a second gloo group of the same ranks: the ranks
all-reduce ``[arrival, duration]`` (ns, the maximum of each) for each collective, and a sender
sends ``[start, end]`` with each message. They are read when a rank first needs the time
(``Collective.interval``), so no rank waits for another beyond what the real operation waits for.

Limits: ``batch_isend_irecv`` runs as single sends and receives (no coalescing on a Python
group); ``monitored_barrier`` and ``recv`` from any source are refused.

Taught in chapter 02 (the modeled network under the real collectives).
"""

from __future__ import annotations

import collections
import threading

import torch
import torch.distributed as dist

from course_utils.runtime import compat
from course_utils.runtime.cluster.network import collective_seconds
from course_utils.runtime.cluster.operations import Collective, Message
from course_utils.runtime.cluster.roofline import tensor_bytes
from course_utils.runtime.cluster.work import ModeledWork

__all__ = ["ModeledGroup", "Collective", "Message"]

_MAX = dist.AllreduceOptions()
_MAX.reduceOp = dist.ReduceOp.MAX


def _nbytes(tensors) -> int:
    """The bytes the tensors hold (a sparse tensor: its indices and values, not its dense size)."""
    return sum(tensor_bytes(t) for t in tensors)


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def _on_meta(tensors) -> bool:
    return any(t.is_meta for t in tensors)


class ModeledGroup(dist.ProcessGroup):
    """A process group of ``size`` ranks over gloo, timed on ``clock`` (a ``RankClock``).

    ``global_ranks``: the world ranks of this group's members, in group order (the network's
    two tiers ask which node each is on); empty for the default group.
    """

    def __init__(self, store, rank: int, size: int, timeout, clock, global_ranks: list[int]):
        super().__init__(rank, size)
        self.clock = clock
        self.cluster = clock.cluster
        default = not global_ranks
        self.global_ranks = list(global_ranks) or list(range(size))
        self.inner = dist.ProcessGroupGloo(dist.PrefixStore("data", store), rank, size, timeout)
        self.stamps = dist.ProcessGroupGloo(dist.PrefixStore("clock", store), rank, size, timeout)
        # What this class does not override (C++ helpers DDP calls) goes straight to gloo, untimed.
        compat.register_cpu_backend(self, self.inner)
        self.lock = threading.RLock()  # issuing: stamps and data go out in the same order
        self.resolving = threading.RLock()  # timing the stream, in order
        self.pending: collections.deque = collections.deque()
        self.stream_end = 0
        self.send_free: dict[int, int] = {}
        self.lane = "collectives" if default else "collectives " + ",".join(map(str, self.global_ranks))

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "cluster"

    # -- collectives -----------------------------------------------------------------------------
    def _collective(
        self, op: str, nbytes: float, result: list, issue, part_bytes: float = 0.0, inputs=()
    ) -> ModeledWork:
        """Issue ``issue()`` (the gloo call) and time it as ``op`` of ``nbytes`` on the network;
        on meta tensors (``result`` or ``inputs``) only the time is exchanged."""
        with self.clock.suspend():
            alpha, beta = self.cluster.network.link(self.global_ranks)
            ns = round(collective_seconds(op, nbytes, self.size(), alpha, beta, part_bytes) * 1e9)
            stamps = torch.tensor([self.clock.current(), ns], dtype=torch.int64)
            with self.lock:  # the stamps and the data go out in the same order on every thread
                stamp_work = self.stamps.allreduce([stamps], _MAX)
                data_work = None if _on_meta([*result, *inputs]) else issue()
                comm = Collective(self, f"{op} {_size(nbytes)}", stamp_work, stamps, data_work)
                self.pending.append(comm)
            self.clock.tag(result, comm)
            return ModeledWork(self.clock, comm, result)

    def resolve(self, comm: Collective) -> None:
        """Time every collective of this group up to ``comm``, in order, from their stamps."""
        with self.resolving, self.clock.suspend():
            while comm.end is None:
                head = self.pending[0]
                head.stamp_wait.wait(None)
                arrival, ns = head.stamps.tolist()
                head.start = max(arrival, self.stream_end)
                head.end = self.stream_end = head.start + ns
                self.pending.popleft()
                self.clock.record_communication(self.lane, head.name, head.start, head.end)

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
            "all_gather",
            _nbytes(outputs),
            outputs,
            lambda: self.inner.allgather(output_lists, inputs, opts),
            inputs=inputs,
        )

    def _allgather_base(self, output, input, opts):
        return self._collective(
            "all_gather",
            _nbytes([output]),
            [output],
            lambda: compat.backend_all_gather_into_tensor(self.inner, output, input, opts),
            inputs=[input],
        )

    def reduce_scatter(self, outputs, input_lists, opts):
        inputs = [t for ins in input_lists for t in ins]
        return self._collective(
            "reduce_scatter",
            _nbytes(inputs),
            outputs,
            lambda: self.inner.reduce_scatter(outputs, input_lists, opts),
            inputs=inputs,
        )

    def _reduce_scatter_base(self, output, input, opts):
        return self._collective(
            "reduce_scatter",
            _nbytes([input]),
            [output],
            lambda: compat.backend_reduce_scatter_tensor(self.inner, output, input, opts),
            inputs=[input],
        )

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        w, me = self.size(), self.rank()
        row_bytes = (input.numel() // max(input.shape[0], 1)) * input.element_size() if input.dim() else 0
        sent = _split_rows(input.shape[0] if input.dim() else 0, input_split_sizes, w, me) * row_bytes
        out_rows = output.shape[0] if output.dim() else 0
        received = _split_rows(out_rows, output_split_sizes, w, me) * row_bytes
        return self._collective(
            "all_to_all",
            max(sent, received),
            [output],
            lambda: self.inner.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts),
            inputs=[input],
        )

    def alltoall(self, outputs, inputs, opts):
        me = self.rank()
        sent = _nbytes([t for j, t in enumerate(inputs) if j != me])
        received = _nbytes([t for j, t in enumerate(outputs) if j != me])
        return self._collective(
            "all_to_all",
            max(sent, received),
            outputs,
            lambda: self.inner.alltoall(outputs, inputs, opts),
            inputs=inputs,
        )

    def gather(self, output_lists, inputs, opts):
        outputs = [t for out in output_lists for t in out]
        return self._collective(
            "gather",
            0,
            outputs,
            lambda: self.inner.gather(output_lists, inputs, opts),
            _nbytes(inputs),
            inputs,
        )

    def scatter(self, outputs, input_lists, opts):
        inputs = [t for ins in input_lists for t in ins]
        return self._collective(
            "scatter",
            0,
            outputs,
            lambda: self.inner.scatter(outputs, input_lists, opts),
            _nbytes(outputs),
            inputs,
        )

    def barrier(self, opts=None):
        return self._collective("barrier", 0, [], lambda: self.inner.barrier(opts or dist.BarrierOptions()))

    def monitored_barrier(self, *args, **kwargs):
        raise RuntimeError(
            "monitored_barrier is gloo's alone and this group is the modeled cluster over gloo: use "
            "dist.barrier, or launch without cluster= for this cell"
        )

    # -- point to point ----------------------------------------------------------------------------
    def _peer_link(self, peer: int) -> tuple[float, float]:
        return self.cluster.network.link([self.global_ranks[self.rank()], self.global_ranks[peer]])

    def send(self, tensors, dst: int, tag: int = 0):
        with self.clock.suspend():
            alpha, beta = self._peer_link(dst)
            ns = round(collective_seconds("send", _nbytes(tensors), 2, alpha, beta) * 1e9)
            with self.lock:
                start = max(self.clock.current(), self.send_free.get(dst, 0))
                end = self.send_free[dst] = start + ns
                stamp = torch.tensor([start, end], dtype=torch.int64)
                stamp_work = self.stamps.send([stamp], dst, tag)
                data_work = None if _on_meta(tensors) else self.inner.send(tensors, dst, tag)
            lane, name = f"send to {self.global_ranks[dst]}", f"send {_size(_nbytes(tensors))}"
            message = Message(self, lane, name, stamp_work, stamp, data_work, (start, end))
            self.clock.record_communication(lane, name, start, end)
            return ModeledWork(self.clock, message, tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        with self.clock.suspend():
            stamp = torch.zeros(2, dtype=torch.int64)
            with self.lock:
                stamp_work = self.stamps.recv([stamp], src, tag)
                data_work = None if _on_meta(tensors) else self.inner.recv(tensors, src, tag)
            lane, name = f"recv from {self.global_ranks[src]}", f"recv {_size(_nbytes(tensors))}"
            message = Message(self, lane, name, stamp_work, stamp, data_work)
            self.clock.tag(tensors, message)
            return ModeledWork(self.clock, message, tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        raise RuntimeError(
            "recv from any source is not modeled (the sender, and so its clock, is unknown until the "
            "bytes arrive): pass src= to dist.recv, or launch without cluster="
        )

    # -- teardown -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        for inner in (self.inner, self.stamps):
            if hasattr(inner, "shutdown"):
                inner.shutdown()

    def abort(self) -> None:
        self.shutdown()


def _split_rows(rows: int, split_sizes: list[int], world: int, me: int) -> int:
    """Rows of a flat all-to-all tensor that cross to other ranks (equal splits when none given)."""
    if split_sizes:
        return rows - split_sizes[me]
    return rows - rows // world
