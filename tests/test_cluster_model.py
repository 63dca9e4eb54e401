"""course_utils.runtime.cluster, without processes: the presets, the network's formulas, what one
operator costs, the clock's arithmetic (overlap, waiting), and the timelines.

Every expected number is written out by hand from the model's definition.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from course_utils.runtime import cluster, compat
from course_utils.runtime.cluster import (
    DEVICES,
    NETWORKS,
    Cluster,
    ClusterTimeline,
    Device,
    Span,
    Wire,
    collective_seconds,
    device,
    network,
)
from course_utils.runtime.cluster.clock import RankClock, Ready
from course_utils.runtime.cluster.roofline import op_cost

pytestmark = [pytest.mark.chapter(2), pytest.mark.usefixtures("agg_backend")]

PEAKS = {"float32": 100e12, "tf32": 400e12, "float16": 800e12, "bfloat16": 800e12}
GPU = Device(
    name="test GPU",
    peak_flops=PEAKS,
    memory_bandwidth=1e12,
    compute_efficiency=0.5,
    memory_efficiency=0.5,
    launch_s=2e-6,
    sms=100,
)  # achieved: 50 TFLOP/s in float32, 500 GB/s; 2 us per kernel
NET = Wire(latency_s=1e-5, bandwidth_Bps=1e10, name="test network", comm_sms=20)
TEST = Cluster(GPU, NET)


# -- presets and input ---------------------------------------------------------------------------
def test_presets_name_their_source_and_hold_the_datasheet_peaks():
    assert set(DEVICES) == {"t4", "v100", "a100", "h100"}
    assert DEVICES["h100"].peak_flops["bfloat16"] == 989.5e12 and DEVICES["h100"].memory_bandwidth == 3.35e12
    assert DEVICES["a100"].peak_flops["tf32"] == 156e12 and DEVICES["t4"].peak_flops["float16"] == 65e12
    assert {"nvlink", "pcie", "pcie-gen3", "infiniband", "ethernet"} <= set(NETWORKS)
    assert all("datasheet" in d.source for d in DEVICES.values())
    assert all(n.source.strip() for n in NETWORKS.values())
    assert device("H100") is DEVICES["h100"] and network(NET) is NET


def test_bad_input_names_the_presets():
    with pytest.raises(ValueError, match="unknown device 'h200': choose one of t4, v100, a100, h100"):
        Cluster("h200")
    with pytest.raises(ValueError, match="unknown network 'nvlnk': choose one of nvlink"):
        Cluster("h100", "nvlnk")
    with pytest.raises(ValueError, match="needs bfloat16"):
        Device(name="x", peak_flops={"float32": 1, "tf32": 1, "float16": 1})
    with pytest.raises(ValueError, match="one node: it has no second tier"):
        Cluster("h100", "nvlink", gpus_per_node=8)
    with pytest.raises(ValueError, match=r"overlap_speed=...\) is a fraction"):
        Cluster("h100", "nvlink", overlap_speed=1.5)
    with pytest.raises(TypeError, match="takes a preset name"):
        Cluster(3)
    for bad in ("h100", "h100:nvlink:x", "gpu:nvlink", '{"device": 1}'):
        with pytest.raises(ValueError) as raised:
            Cluster.from_env(bad)
        message = str(raised.value)
        assert "\n" not in message and "t4, v100, a100, h100" in message and "nvlink, pcie" in message


def test_the_environment_variable_and_json_round_trip():
    assert Cluster.from_env("a100:infiniband:8") == Cluster("a100", "infiniband", gpus_per_node=8)
    assert Cluster.from_env(TEST.to_json()) == TEST
    chosen = Cluster("h100", "infiniband", gpus_per_node=8, tf32=True, overlap_speed=0.9)
    assert Cluster.from_json(chosen.to_json()) == chosen
    assert "H100" in chosen.label and "InfiniBand" in chosen.label


def test_overlap_speed_is_the_share_of_sms_nccl_leaves():
    assert TEST.compute_speed_during_communication == 0.8  # (100 - 20) / 100
    assert Cluster("h100", "nvlink").compute_speed_during_communication == (132 - 24) / 132
    assert Cluster("t4", "pcie-gen3").compute_speed_during_communication == (40 - 2) / 40
    assert Cluster(GPU, NET, overlap_speed=0.5).compute_speed_during_communication == 0.5


# -- the network ------------------------------------------------------------------------------------
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
    with pytest.raises(ValueError, match="unknown operation 'allreduce'"):
        collective_seconds("allreduce", 1, 2, 0.0, 1.0)


def test_two_tiers_pick_the_link_by_node():
    grouped = network("infiniband").with_nodes(2)
    assert grouped.link([1, 2]) == (10e-6, 50e9)  # across nodes: InfiniBand
    assert grouped.link([0, 1]) == (5e-6, 450e9)  # inside a node: NVLink
    assert grouped.link([0, 1, 2, 3]) == (10e-6, 50e9)  # a ring across nodes runs at the slow tier's pace
    assert network("infiniband").link([0, 1]) == (10e-6, 50e9)  # no nodes given: every rank a node


# -- one operator ---------------------------------------------------------------------------------
def cost(fn, *args, cluster_=TEST):
    """The cost of the one ATen operator ``fn(*args)`` runs, priced on ``cluster_``."""
    seen = []

    class Capture(compat.DISPATCH_MODE_BASE):  # a probe: which operators run
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            seen.append(op_cost(func, a, kw or {}, out, cluster_))
            return out

    with Capture():
        fn(*args)
    priced = [c for c in seen if c is not None]
    assert len(priced) == 1, seen
    return priced[0]


def test_a_matrix_product_is_priced_by_its_flops():
    a, b = torch.ones(256, 512), torch.ones(512, 1024)
    c = cost(torch.mm, a, b)
    flops = 2 * 256 * 512 * 1024
    moved = 4 * (256 * 512 + 512 * 1024 + 256 * 1024)
    assert (c.flops, c.bytes) == (flops, moved)
    assert c.ns == round((moved / 500e9 + 2e-6) * 1e9)  # memory-bound here: 7.3 us (5.4 us of FLOPs) + 2 us
    big = cost(torch.mm, torch.ones(2048, 2048), torch.ones(2048, 2048))
    assert big.ns == round((2 * 2048**3 / 50e12 + 2e-6) * 1e9)  # compute-bound: 344 us + 2 us
    tf32 = cost(torch.mm, a, b, cluster_=Cluster(GPU, NET, tf32=True))
    assert tf32.ns == round((max(flops / 200e12, moved / 500e9) + 2e-6) * 1e9)
    half = cost(torch.mm, a.bfloat16(), b.bfloat16())
    assert half.ns == round((max(flops / 400e12, moved / 2 / 500e9) + 2e-6) * 1e9)


def test_an_elementwise_operator_is_priced_by_its_bytes():
    x, y = torch.ones(1 << 20), torch.ones(1 << 20)
    c = cost(torch.add, x, y)
    assert (c.flops, c.bytes) == (0, 3 * 4 << 20)  # two read, one written
    assert c.ns == round((3 * 4 * 2**20 / 500e9 + 2e-6) * 1e9)
    assert cost(lambda t: t.copy_(y), x).bytes == 2 * 4 << 20  # copy_ reads the source only
    assert cost(lambda t: t.zero_(), x).bytes == 4 << 20  # and zero_ reads nothing
    out = torch.empty(1 << 20)
    assert cost(lambda: torch.add(x, y, out=out)).bytes == 3 * 4 << 20  # out= is written, not read


def test_views_allocation_and_host_reads_are_free():
    x = torch.ones(8, 8)
    seen = []

    class Capture(compat.DISPATCH_MODE_BASE):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            seen.append((str(func), op_cost(func, a, kw or {}, out, TEST)))
            return out

    with Capture():
        x.t(), x.view(64), x[2:], x.expand(2, 8, 8), torch.empty(5), x.sum().item(), x.detach()
    priced = [name for name, c in seen if c is not None]
    assert priced == ["aten.sum.default"], seen


def test_a_lookup_reads_the_rows_it_gathers_not_its_table():
    table = torch.ones(100_000, 64)
    ids, offsets = torch.arange(0, 4000, 2), torch.arange(0, 2000, 20)
    c = cost(torch.nn.functional.embedding_bag, ids, table, offsets)
    rows = 2000 * 64 * 4  # the looked-up rows, not 100 000 x 64
    assert c.flops == 2000 * 64  # one add per id and column
    assert c.bytes >= rows + 100 * 64 * 4 and c.bytes < rows + 100 * 64 * 4 + 50_000
    gathered = cost(torch.index_select, table, 0, ids)
    assert gathered.bytes == 2 * 2000 * 64 * 4 + 2000 * 8  # rows out, rows in, the ids


def test_a_sparse_gradient_added_into_its_table_touches_its_rows_only():
    table = torch.zeros(100_000, 64)
    rows = torch.sparse_coo_tensor(torch.tensor([[3, 70, 5000]]), torch.ones(3, 64), (100_000, 64))
    c = cost(lambda: table.add_(rows))
    values, indices = 3 * 64 * 4, 3 * 8
    assert (c.flops, c.bytes) == (0, (indices + values) + values + values)  # read both, write the rows


# -- the clock ------------------------------------------------------------------------------------
class Fixed:
    """A communication whose interval is known (what a group's Collective gives once resolved)."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end

    def interval(self):
        return self.start, self.end


class Priced:
    def __init__(self, ns):
        self.ns, self.flops, self.bytes = ns, 0, 0


def test_waiting_joins_the_end_and_overlap_slows_what_ran_beside_it():
    clock = RankClock(0, TEST)  # compute beside communication at 0.8 of its speed
    clock.charge(Priced(1000))  # compute [0, 1000)
    clock.join(Fixed(500, 800))  # 300 ns of it overlapped: 300 x (1/0.8 - 1) = 75 ns more
    assert clock.now == 1075
    clock.join(Fixed(500, 800))  # the same communication again: nothing more to price
    assert clock.now == 1075
    clock.join(Fixed(1000, 3000))  # compute [1000, 1075) is the slowdown itself, inside: 75/4
    assert clock.now == 3000
    clock.charge(Priced(100))
    clock.join(Ready(2000, ()))  # a value ready in the past: no wait, no slowdown
    assert clock.now == 3100
    clock.join(Ready(5000, ()))
    assert clock.now == 5000


def test_labels_follow_forward_backward_and_the_optimizer():
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cluster.install(TEST)
    try:
        with cluster.region("data"):
            x = torch.ones(32, 64)
        model(x).sum().backward()
        opt.step()
        spans = cluster.timeline().spans
        assert [s.name for s in spans] == ["data", "forward", "compute", "backward", "optimizer"]
        assert spans[-1].end_ns == cluster.modeled_ns()
        assert cluster.charged()["ops"] > 5 and cluster.modeled_time() == cluster.modeled_ns() / 1e9
        by_op = cluster.charged(by_op=True)["by_op"]
        assert by_op["aten::addmm"]["calls"] == 1 and by_op["aten::addmm"]["flops"] == 2 * 32 * 64 * 64
        assert sum(t["ns"] for t in by_op.values()) == cluster.modeled_ns()
    finally:
        cluster.uninstall()
    with pytest.raises(RuntimeError, match="no modeled cluster in this process"):
        cluster.modeled_time()


def test_work_the_operators_do_not_show():
    cluster.install(TEST)
    try:
        start = cluster.modeled_ns()
        cluster.spend(0.002, "write to storage")  # blocking: the stream waits 2 ms
        assert cluster.modeled_ns() == start + 2_000_000
        first = cluster.in_background(0.003, "async write")  # beside the stream: no wait now
        second = cluster.in_background(0.001, "async write")  # queued behind the first on its lane
        assert cluster.modeled_ns() == start + 2_000_000
        assert second.interval() == (start + 5_000_000, start + 6_000_000)
        second.wait()
        assert cluster.modeled_ns() == start + 6_000_000
        first.wait()  # already over: nothing more
        assert cluster.modeled_ns() == start + 6_000_000
        with pytest.raises(ValueError, match="must be >= 0"):
            cluster.spend(-1, "x")
        lanes = {s.lane for s in cluster.timeline().spans}
        assert lanes == {"compute", "storage"}
    finally:
        cluster.uninstall()


def test_timed_on_times_a_block_on_one_modeled_gpu():
    a = torch.ones(2048, 2048)
    with cluster.timed_on(TEST) as run:
        a @ a  # 2 x 2048^3 FLOP at 50 TFLOP/s, compute-bound, + 2 us
    assert run.ns == round((2 * 2048**3 / 50e12 + 2e-6) * 1e9) and run.ops == 1
    assert run.seconds == run.ns / 1e9 and cluster.installed() is None  # nothing charged afterwards
    with cluster.timed_on(TEST), pytest.raises(RuntimeError, match="already a rank"):
        with cluster.timed_on(TEST):
            pass


def test_meta_tensors_cost_what_real_ones_do():
    def step(device):
        cluster.install(TEST)
        try:
            with torch.device(device):
                model = torch.nn.Sequential(
                    torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
                )
                x = torch.ones(64, 128)
            start = cluster.modeled_ns()
            model(x).sum().backward()
            return cluster.modeled_ns() - start
        finally:
            cluster.uninstall()

    assert step("meta") == step("cpu") > 0


# -- timelines ------------------------------------------------------------------------------------
def test_a_timeline_merges_ranks_and_writes_a_trace(tmp_path):
    one = ClusterTimeline(
        (Span(0, "compute", "forward", 0, 100), Span(0, "collectives", "all_reduce", 50, 150)), "x"
    )
    two = ClusterTimeline(
        (Span(1, "compute", "forward", 0, 120), Span(1, "compute", "backward", 110, 200)), "x"
    )
    merged = ClusterTimeline.merge([one, two])
    assert merged.ranks == [0, 1] and merged.makespan_ns == 200 and merged.label == "x"
    assert merged.busy_ns(1) == 200 and merged.busy_ns(0, "collectives") == 100
    assert merged.window(100, 160).on(0) == [Span(0, "collectives", "all_reduce", 100, 150)]
    trace = merged.to_chrome_trace(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text()) == trace
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 4 and {e["pid"] for e in complete} == {0, 1}
    assert math.isclose(sum(e["dur"] for e in complete), (100 + 100 + 120 + 90) / 1e3)
    figure = merged.plot()
    assert len(figure.axes[0].get_yticklabels()) == 3  # rank 0 compute, rank 0 collectives, rank 1 compute


def test_the_roofline_lines_up_with_the_profiler():
    """compare_step (gpu_report's section 5) on this CPU: the profiler finds each operator the mode
    priced, as many times (CPU times here, kernels' device times on a GPU)."""
    from course_utils.runtime.cluster.compare import compare_step, comparison_table

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(32, 64)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    rows = compare_step(step, TEST, steps=2, warmup=1)
    by_op = {r["op"]: r for r in rows}
    assert {"aten::addmm", "aten::mm", "aten::relu", "aten::threshold_backward"} <= set(by_op)
    assert by_op["aten::addmm"]["calls"] == 2 and by_op["aten::mm"]["calls"] == 3
    assert all(r["measured_us"] > 0 and r["ratio"] is not None for r in rows)
    table = comparison_table(rows)
    assert table[-1].startswith(f"| all {len(rows)} operators |") and len(table) == 2 + min(12, len(rows)) + 1


def test_the_report_picks_the_preset_by_the_gpu_name():
    from course_utils.scripts.gpu_report import preset_for

    assert preset_for("NVIDIA H100 80GB HBM3") == "h100" and preset_for("Tesla T4") == "t4"
    assert preset_for("NVIDIA A100-SXM4-40GB") == "a100" and preset_for("Tesla V100-SXM2-16GB") == "v100"
    assert preset_for("NVIDIA L4") == "h100"  # no preset: the report says it compared with H100's
