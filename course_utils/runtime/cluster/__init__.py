"""A modeled GPU cluster in virtual time, under the real processes and collectives.

Each rank keeps a clock in whole nanoseconds of a named GPU. The ranks, gloo's bytes and every
number stay real and bit-identical; only time is modeled, so every time is a pure function of
the program (its operators, shapes, dtypes, bytes and their order), the same on every machine
and under any load:

* compute: every ATen operator is priced by a roofline on the modeled device (``roofline``),
  through a dispatch mode (``mode``);
* communication: the network's alpha-beta model (``network``), one stream per process group,
  one queue per peer and direction, a start at the last rank's arrival (``group``), and
  ``wait()`` joining the compute clock (``clock``, ``work``);
* overlap is not free: compute beside a collective runs on the SMs NCCL leaves it.

Use it through ``launch(fn, world_size=..., cluster=Cluster("h100", "nvlink"))`` (CPU and gloo
whatever GPUs this machine has), or in a torchrun script with ``COURSE_CLUSTER=h100:nvlink`` and
``dist.init_process_group(backend_from_env("gloo"))``. Inside a rank:

* ``modeled_time()``: this rank's modeled seconds so far; ``modeled_ns()`` the exact integer;
* ``timeline()``: this rank's spans (``ClusterTimeline``; ``ClusterTimeline.merge`` the ranks'
  results, then ``.plot()`` or ``.to_chrome_trace(path)``);
* ``region(name)``: name the compute spans run inside it;
* ``spend(seconds, name)``: work the operators do not show (a blocking write to storage, host
  code you model), on the compute stream; ``in_background(seconds, name, lane)``: such work on a
  lane of its own (an asynchronous checkpoint's write), joined later with ``.wait()``;
* ``charged()``: operators, FLOPs and bytes priced so far.

Without ranks, ``with timed_on(Cluster("h100", "nvlink")) as run: step()`` times what a block
runs in this process on one modeled GPU (``run.seconds``, exact), and stops charging after it.

A model on the ``meta`` device runs at real sizes without real compute: its operators are priced
from their shapes and its collectives move nothing (only their times are exchanged).

Taught in chapter 02 (the modeled cluster) and used by every timing lesson after it.
"""

from __future__ import annotations

import contextlib
import os
import weakref

from course_utils.runtime.cluster.devices import DEVICES, Device, device
from course_utils.runtime.cluster.network import NETWORKS, Wire, collective_seconds, network
from course_utils.runtime.cluster.spec import ENV, Cluster
from course_utils.runtime.cluster.timeline import ClusterTimeline, Span

__all__ = [
    "Cluster",
    "Device",
    "Wire",
    "DEVICES",
    "NETWORKS",
    "device",
    "network",
    "collective_seconds",
    "ClusterTimeline",
    "Span",
    "ENV",
    "BACKEND",
    "install",
    "uninstall",
    "installed",
    "backend_from_env",
    "modeled_time",
    "modeled_ns",
    "timeline",
    "region",
    "spend",
    "in_background",
    "charged",
    "timed_on",
]

BACKEND = "cluster"


class _State:
    def __init__(self, cluster: Cluster, clock, mode, hooks):
        self.cluster, self.clock, self.mode, self.hooks = cluster, clock, mode, hooks
        self.groups: weakref.WeakSet = weakref.WeakSet()


_STATE: _State | None = None


def _create(options, backend_options=None):
    """``register_backend``'s creator (extended API): one ``ModeledGroup`` per process group."""
    from course_utils.runtime.cluster.group import ModeledGroup

    if _STATE is None:
        raise RuntimeError(
            f"a process group with backend '{BACKEND}' needs a cluster: call "
            "course_utils.runtime.cluster.install(Cluster(...)) first, or launch(fn, cluster=...)"
        )
    ranks = list(options.global_ranks_in_group)
    group = ModeledGroup(
        options.store, options.group_rank, options.group_size, options.timeout, _STATE.clock, ranks
    )
    _STATE.groups.add(group)
    return group


def _phase_hooks(clock) -> list:
    """Global hooks that tell the clock when a module's forward or an optimizer's step runs."""
    import threading

    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def step(phase: str, delta: int):
        def hook(*_args):
            if threading.get_ident() == clock.thread:
                clock.phase[phase] = max(clock.phase[phase] + delta, 0)

        return hook

    return [
        register_module_forward_pre_hook(step("forward", +1)),
        register_module_forward_hook(step("forward", -1)),
        register_optimizer_step_pre_hook(step("optimizer", +1)),
        register_optimizer_step_post_hook(step("optimizer", -1)),
    ]


def install(cluster: Cluster) -> str:
    """Make this process a rank of ``cluster``: its clock starts, every operator this thread runs
    from now on is charged, and process groups started with the returned backend name
    (``"cluster"``) are timed on the network. ``launch(fn, cluster=...)`` calls it for you."""
    global _STATE
    import torch.distributed as dist

    from course_utils.runtime.cluster.clock import RankClock
    from course_utils.runtime.cluster.mode import ChargeMode

    if not isinstance(cluster, Cluster):
        raise TypeError(f"install needs a course_utils.Cluster, got {type(cluster).__name__}")
    if _STATE is not None:
        if _STATE.cluster == cluster:
            return BACKEND
        uninstall()
    clock = RankClock(int(os.environ.get("RANK", "0")), cluster)
    mode = ChargeMode(clock)
    mode.__enter__()
    _STATE = _State(cluster, clock, mode, _phase_hooks(clock))
    os.environ[ENV] = cluster.to_json()
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    return BACKEND


def uninstall() -> None:
    """Stop charging (on the thread that installed it) and forget the clock."""
    global _STATE
    if _STATE is None:
        return
    for handle in _STATE.hooks:
        handle.remove()
    _STATE.mode.__exit__(None, None, None)
    os.environ.pop(ENV, None)
    _STATE = None


def installed() -> Cluster | None:
    """The cluster this process is a rank of, or None."""
    return _STATE.cluster if _STATE is not None else None


def backend_from_env(default: str) -> str:
    """``"cluster"`` (installed) when ``COURSE_CLUSTER`` names a cluster, else ``default``; a bad
    value raises a ValueError naming the presets."""
    text = os.environ.get(ENV)
    return install(Cluster.from_env(text)) if text else default


def _require():
    if _STATE is None:
        raise RuntimeError(
            "no modeled cluster in this process: run the function with launch(fn, cluster=Cluster(...)), "
            f"or a torchrun script with {ENV}=h100:nvlink and backend_from_env"
        )
    return _STATE


def modeled_ns() -> int:
    """This rank's modeled time so far, in whole nanoseconds (its compute stream's clock)."""
    return _require().clock.current()


def modeled_time() -> float:
    """This rank's modeled time so far, in seconds."""
    return modeled_ns() / 1e9


def timeline() -> ClusterTimeline:
    """This rank's spans so far (the collectives it issued, timed first: like a synchronize, it
    waits until every rank has issued them)."""
    state = _require()
    for group in list(state.groups):
        if group.pending:
            group.resolve(group.pending[-1])
    return ClusterTimeline(tuple(state.clock.all_spans()), state.cluster.label)


@contextlib.contextmanager
def region(name: str):
    """Name the compute this rank's thread runs inside the block (``with region("embeddings"):``)."""
    state = _require()
    state.clock.regions.append(str(name))
    try:
        yield
    finally:
        state.clock.regions.pop()


def charged(by_op: bool = False) -> dict:
    """``{"ops", "flops", "bytes"}`` this rank's clock has priced so far; ``by_op=True`` adds
    ``"by_op"``: ``{"aten::addmm": {"calls", "ns", "flops", "bytes"}, ...}``."""
    clock = _require().clock
    with clock.lock:
        totals = {"ops": clock.ops, "flops": clock.flops, "bytes": clock.bytes}
        if by_op:
            keys = ("calls", "ns", "flops", "bytes")
            totals["by_op"] = {op: dict(zip(keys, tally, strict=True)) for op, tally in clock.by_op.items()}
    return totals


def spend(seconds: float, name: str) -> None:
    """Keep this rank's compute stream busy for ``seconds`` of modeled time under ``name``: work
    the operators do not show, such as a blocking write to storage."""
    state = _require()
    ns = round(seconds * 1e9)
    if ns < 0:
        raise ValueError(f"spend(seconds=...) must be >= 0, got {seconds!r}")
    clock = state.clock
    with clock.lock:
        start = clock.now
        clock.now += ns
        clock.busy_until(start, clock.now)
        clock.record_compute(str(name), start, clock.now)


class Background:
    """Work on a lane of its own (``in_background``); ``wait()`` joins it to the rank's clock."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end

    def interval(self) -> tuple[int, int]:
        return self.start, self.end

    def wait(self) -> None:
        from course_utils.runtime.cluster.clock import Ready

        _require().clock.join(Ready(self.end))


def in_background(seconds: float, name: str, lane: str = "storage") -> Background:
    """Work of ``seconds`` on ``lane``, beside the compute stream: it starts now, or when the lane
    has finished what it was given before, and does not hold the stream; ``.wait()`` on the
    result makes the stream wait for it (an asynchronous checkpoint's write, say)."""
    state = _require()
    ns = round(seconds * 1e9)
    if ns < 0:
        raise ValueError(f"in_background(seconds=...) must be >= 0, got {seconds!r}")
    clock = state.clock
    with clock.lock:
        start = max(clock.current(), clock.lanes_free.get(lane, 0))
        clock.lanes_free[lane] = start + ns
    clock.record_communication(lane, str(name), start, start + ns)
    return Background(start, start + ns)


class Timed:
    """What ``timed_on`` measured: ``ns`` (whole nanoseconds), ``seconds``, and ``ops``, ``flops``,
    ``bytes`` priced."""

    ns = ops = flops = bytes = 0

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


@contextlib.contextmanager
def timed_on(cluster: Cluster):
    """Time the block in this process as one GPU of ``cluster``, no other ranks: every operator it
    runs (for real) is priced; afterwards nothing is charged any more. Yields a ``Timed``, filled
    in when the block ends."""
    if _STATE is not None:
        raise RuntimeError("timed_on: this process is already a rank of a modeled cluster; use modeled_ns()")
    install(cluster)
    result = Timed()
    try:
        yield result
    finally:
        spent = charged()
        result.ns = _require().clock.now
        result.ops, result.flops, result.bytes = spent["ops"], spent["flops"], spent["bytes"]
        uninstall()
