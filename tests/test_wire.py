"""course_utils.runtime.wire: the modeled interconnect.

* the model: each formula at hand-computed points, the two tiers, bad input;
* results: every operation the course uses gives bit for bit what plain gloo gives, and DDP
  trains to exactly the same parameters, with and without a wire;
* time: an operation never finishes before the model says (a lower bound, which no load can
  break), operations queue on one link, and a rank waiting on the wire uses almost no CPU.
  How close to the model it lands is ``benchmarks/wire.py``'s job, not a test's.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.distributed as dist

from course_utils import LaunchError, Wire, launch
from course_utils.runtime import compat
from course_utils.runtime.launcher.api import _wire_json
from course_utils.runtime.wire import PRESETS, collective_seconds, preset
from course_utils.runtime.wire.calibrate import GPU_ACHIEVED_FLOPS, measure_flops, time_scale

FAST = Wire(latency_s=1e-3, bandwidth_Bps=1e9, name="fast test wire")


# -- the model -------------------------------------------------------------------------------
def test_each_formula_at_a_hand_computed_point():
    a, b, n = 0.01, 1e6, 4e6  # 10 ms, 1 MB/s, 4 MB
    assert collective_seconds("all_reduce", n, 4, a, b) == pytest.approx(2 * 3 * (0.01 + 1.0))
    assert collective_seconds("all_gather", n, 4, a, b) == pytest.approx(3 * (0.01 + 1.0))
    assert collective_seconds("reduce_scatter", n, 4, a, b) == pytest.approx(3 * (0.01 + 1.0))
    assert collective_seconds("broadcast", n, 4, a, b) == pytest.approx(2 * (0.01 + 4.0))
    assert collective_seconds("broadcast", n, 5, a, b) == pytest.approx(3 * (0.01 + 4.0))
    assert collective_seconds("all_to_all", n, 4, a, b) == pytest.approx(3 * 0.01 + 4.0)
    assert collective_seconds("gather", 0, 4, a, b, part_bytes=1e6) == pytest.approx(3 * (0.01 + 1.0))
    assert collective_seconds("barrier", 0, 8, a, b) == pytest.approx(3 * 0.01)
    assert collective_seconds("send", n, 2, a, b) == pytest.approx(0.01 + 4.0)
    assert collective_seconds("all_reduce", n, 1, a, b) == 0.0  # one rank: nothing moves


def test_scaling_keeps_the_latency_and_bandwidth_shape():
    wire = PRESETS["nvlink"].scaled(1000)
    assert wire.alpha == pytest.approx(PRESETS["nvlink"].latency_s * 1000)
    assert wire.beta == pytest.approx(PRESETS["nvlink"].bandwidth_Bps / 1000)
    # the message size at which latency and bandwidth terms are equal does not move
    assert wire.alpha * wire.beta == pytest.approx(
        PRESETS["nvlink"].latency_s * PRESETS["nvlink"].bandwidth_Bps
    )


def test_two_tiers_pick_the_link_by_node():
    wire = preset("infiniband", ranks_per_node=2)
    inside, between = wire.link([0, 1]), wire.link([1, 2])
    assert between == (wire.alpha, wire.beta)
    assert inside == (wire.node_latency_s, wire.node_bandwidth_Bps)
    assert wire.link([0, 1, 2, 3]) == between  # a ring across nodes runs at the slow tier's pace
    assert preset("infiniband").link([0, 1]) == between  # no ranks_per_node: every rank a node


def test_bad_input_gets_clear_errors():
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        Wire(latency_s=0.0, bandwidth_Bps=0)
    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        Wire(latency_s=-1.0, bandwidth_Bps=1e9)
    with pytest.raises(ValueError, match="node_latency_s and node_bandwidth_Bps"):
        Wire(latency_s=0.0, bandwidth_Bps=1e9, ranks_per_node=2)
    with pytest.raises(ValueError, match="unknown wire preset 'nvlnk'; choose one of nvlink"):
        preset("nvlnk")
    with pytest.raises(ValueError, match="one node: it has no second tier"):
        preset("nvlink", ranks_per_node=2)
    with pytest.raises(ValueError, match="unknown operation 'allreduce'"):
        collective_seconds("allreduce", 1, 2, 0.0, 1.0)
    with pytest.raises(ValueError, match="COURSE_WIRE must hold a Wire"):
        Wire.from_json('{"latency": 1}')
    with pytest.raises(TypeError, match="wire must be a course_utils.Wire"):
        _wire_json({"latency_s": 1}, "gloo")
    with pytest.raises(LaunchError, match="on GPUs NCCL's real network"):
        _wire_json(FAST, "nccl")
    assert Wire.from_json(FAST.to_json()) == FAST


def test_calibration_is_a_positive_ratio_to_the_gpu():
    flops = measure_flops(rows=64, width=128, repeats=3)
    assert 1e8 < flops < 1e13  # a CPU core: between 0.1 and 10 000 GFLOP/s
    assert time_scale() == pytest.approx(GPU_ACHIEVED_FLOPS / measure_flops(), rel=10)  # same order


# -- results: bit for bit what gloo gives ------------------------------------------------------
def every_operation() -> dict:
    """Run every collective and point-to-point call the course uses; return what each produced."""
    w, me = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(me)
    x = torch.randn(12, generator=g)
    out = {}
    t = x.clone()
    dist.all_reduce(t)
    out["all_reduce"] = t
    t = x.clone()
    dist.all_reduce(t, async_op=True).wait()
    out["all_reduce async"] = t
    t = x.clone()
    dist.broadcast(t, src=w - 1)
    out["broadcast"] = t
    t = x.clone()
    dist.reduce(t, dst=0)
    out["reduce"] = t if me == 0 else torch.zeros(0)
    parts = [torch.zeros(12) for _ in range(w)]
    dist.all_gather(parts, x)
    out["all_gather"] = torch.cat(parts)
    flat = torch.zeros(12 * w)
    dist.all_gather_into_tensor(flat, x)
    out["all_gather_into_tensor"] = flat
    mine = torch.zeros(4)
    dist.reduce_scatter_tensor(mine, torch.cat([x[:4]] * w))
    out["reduce_scatter_tensor"] = mine
    mine = torch.zeros(4)
    dist.reduce_scatter(mine, [x[:4] * (k + 1) for k in range(w)])
    out["reduce_scatter"] = mine
    send_splits = [k + 1 for k in range(w)]  # uneven: rank j gets j+1 rows from everyone
    received = torch.zeros((me + 1) * w)
    dist.all_to_all_single(
        received,
        torch.arange(sum(send_splits), dtype=torch.float32) + 100 * me,
        output_split_sizes=[me + 1] * w,
        input_split_sizes=send_splits,
    )
    out["all_to_all_single"] = received
    outs = [torch.zeros(2) for _ in range(w)]
    compat.all_to_all(outs, [x[2 * k : 2 * k + 2] for k in range(w)])
    out["all_to_all"] = torch.cat(outs)
    gathered = [torch.zeros(12) for _ in range(w)] if me == 0 else None
    dist.gather(x, gathered, dst=0)
    out["gather"] = torch.cat(gathered) if me == 0 else torch.zeros(0)
    mine = torch.zeros(3)
    dist.scatter(mine, [torch.full((3,), float(k)) for k in range(w)] if me == 0 else None, src=0)
    out["scatter"] = mine
    right, left = (me + 1) % w, (me - 1) % w
    got = torch.zeros(12)
    if me % 2 == 0:
        dist.send(x, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(x, right)
    out["send/recv"] = got.clone()
    works = [dist.isend(x * 2, right), dist.irecv(got, left)]
    for work in works:
        work.wait()
    out["isend/irecv"] = got.clone()
    ops = [dist.P2POp(dist.isend, x * 3, right), dist.P2POp(dist.irecv, got, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batch_isend_irecv"] = got.clone()
    if me in (0, 1):  # two tags, received in the other order than sent: paired by tag, as gloo pairs them
        a, b = torch.zeros(5), torch.zeros(7)
        if me == 0:
            works = [dist.isend(x[:5], 1, tag=1), dist.isend(x[:7] * 5, 1, tag=2)]
        else:
            works = [dist.irecv(b, 0, tag=2), dist.irecv(a, 0, tag=1)]
        for work in works:
            work.wait()
        out["tags"] = torch.cat([a, b])
    objects = [None] * w
    dist.all_gather_object(objects, {"rank": me, "sum": float(x.sum())})
    out["all_gather_object"] = torch.tensor([o["sum"] for o in objects])
    dist.barrier()
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_operation_gives_exactly_what_gloo_gives(world_size):
    plain = launch(every_operation, world_size=world_size)
    wired = launch(every_operation, world_size=world_size, wire=FAST)
    for rank, (p, m) in enumerate(zip(plain, wired, strict=True)):
        assert p.keys() == m.keys()
        for name in p:
            assert torch.equal(p[name], m[name]), f"rank {rank}: {name} differs under the wire"


def train_ddp(steps: int = 4) -> tuple[list[torch.Tensor], str]:
    """A few DDP steps (several buckets) on rank-specific data; the final parameters and backend."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(16, 32, generator=g)).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], dist.get_backend()


def test_ddp_trains_to_the_same_parameters_bit_for_bit():
    plain = launch(train_ddp)
    wired = launch(train_ddp, wire=FAST)
    assert plain[0][1] == "gloo" and wired[0][1] == "wire"
    for (p_params, _), (m_params, _) in zip(plain, wired, strict=True):
        assert max((a - b).abs().max().item() for a, b in zip(p_params, m_params, strict=True)) == 0.0


# -- time ----------------------------------------------------------------------------------------
def timed_calls(nbytes: int) -> dict:
    """Seconds of: one all-reduce, two async all-reduces issued together, one message 0 -> 1."""
    t, u = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
    seconds = {}
    dist.barrier()
    start = time.monotonic()
    dist.all_reduce(t)
    seconds["one"] = time.monotonic() - start
    dist.barrier()
    start = time.monotonic()
    works = [dist.all_reduce(t, async_op=True), dist.all_reduce(u, async_op=True)]
    for work in works:
        work.wait()
    seconds["two queued"] = time.monotonic() - start
    dist.barrier()
    start = time.monotonic()
    if dist.get_rank() == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    seconds["send"] = time.monotonic() - start
    return seconds


def test_operations_finish_no_earlier_than_the_model_and_queue_on_one_link():
    wire = Wire(latency_s=0.05, bandwidth_Bps=10e6)
    nbytes = 400_000  # all-reduce: 2 (0.05 + 0.02) = 0.14 s; send: 0.05 + 0.04 = 0.09 s
    one = collective_seconds("all_reduce", nbytes, 2, wire.alpha, wire.beta)
    send = collective_seconds("send", nbytes, 2, wire.alpha, wire.beta)
    for rank, seconds in enumerate(launch(timed_calls, nbytes, wire=wire)):
        assert seconds["one"] >= one * 0.999
        assert seconds["two queued"] >= 2 * one * 0.999
        # the sender's link starts the message when it posts it; the receiver may start its clock
        # a little later (the ranks leave the barrier at slightly different moments)
        assert seconds["send"] >= (send * 0.999 if rank == 0 else send * 0.8)
        assert seconds["one"] < one + 2.0  # and it does finish (2 s: room for a loaded machine)


def cpu_share_while_waiting() -> float:
    """CPU time this rank spends while one modeled all-reduce runs, as a fraction of one core."""
    t = torch.zeros(1)
    dist.barrier()
    cpu, wall = time.process_time(), time.monotonic()
    dist.all_reduce(t)
    return (time.process_time() - cpu) / (time.monotonic() - wall)


def test_a_rank_waiting_on_the_wire_uses_almost_no_cpu():
    shares = launch(cpu_share_while_waiting, wire=Wire(latency_s=0.5, bandwidth_Bps=1e9))
    assert max(shares) < 0.1, f"CPU share while waiting: {shares} (a busy loop?)"
    assert not math.isnan(max(shares))


# -- torchrun: the wire from COURSE_WIRE -------------------------------------------------------------
TORCHRUN_SCRIPT = """
import time, torch, torch.distributed as dist
from course_utils.runtime.wire import backend_from_env
dist.init_process_group(backend_from_env("gloo"))
t = torch.ones(1)
dist.barrier()
start = time.monotonic()
dist.all_reduce(t)
if dist.get_rank() == 0:
    print("RESULT", dist.get_backend(), t.item(), time.monotonic() - start)
dist.destroy_process_group()
"""


def test_a_torchrun_script_runs_on_the_wire_named_in_course_wire(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(TORCHRUN_SCRIPT)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    plain = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    wire = Wire(latency_s=0.1, bandwidth_Bps=1e9)
    wired = subprocess.run(
        command, env={**env, "COURSE_WIRE": wire.to_json()}, capture_output=True, text=True, timeout=120
    )

    def result(run):  # the script's line (torchrun may print its own lines too)
        lines = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, run.stdout[-2000:] + run.stderr[-2000:]
        return lines[0]

    backend, total, _ = result(plain)
    assert (backend, total) == ("gloo", "2.0")
    backend, total, seconds = result(wired)
    assert (backend, total) == ("wire", "2.0")
    assert float(seconds) >= 2 * 0.1 * 0.999  # all-reduce on 2 ranks: 2 (w - 1) alpha at least
