"""course_utils.collectives: the ring all-reduce against dist.all_reduce, every collective demo's
result against its definition, bandwidth formulas and the alpha-beta fit, clear init errors."""

import contextlib
import math
import socket

import pytest
import torch
import torch.distributed as dist
from helpers.p2p import LoneP2PError, only_batched_p2p

from course_utils import launch
from course_utils.collectives import (
    GroupInitError,
    bandwidth,
    free_port,
    init_group,
    plain_ring_all_reduce,
    ring_all_reduce,
    ring_schedule,
    runs,
)

pytestmark = pytest.mark.chapter(2)

# Shapes: odd lengths, lengths smaller than the world size, multi-dimensional, empty.
SHAPES = [(1,), (2,), (3,), (5,), (7,), (13,), (1000,), (1001,), (4, 3), (2, 3, 5), (0,), (65537,)]
DTYPES = [torch.float32, torch.float64, torch.int64]
# Tolerance: the ring adds the w numbers in another order than gloo does, so float
# results may differ in the last bits; integer sums must be exact.
TOLERANCE = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.int64: dict(rtol=0, atol=0),
}


def _random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def compare_ring_with_all_reduce(segment_bytes, shapes=SHAPES, plain=False):
    """On every rank: for each shape and dtype, ring_all_reduce (or, with ``plain``,
    plain_ring_all_reduce) vs dist.all_reduce; what differed."""
    rank, failures = dist.get_rank(), []
    for i, shape in enumerate(shapes):
        for dtype in DTYPES:
            mine = _random(shape, dtype, seed=1000 * i + rank)
            expected, ours = mine.clone(), mine.clone()
            dist.all_reduce(expected)
            if plain:
                returned = plain_ring_all_reduce(ours)
            else:
                returned = ring_all_reduce(ours, segment_bytes=segment_bytes)
            if returned is not ours:
                failures.append(f"{shape} {dtype}: did not return its argument")
            try:
                torch.testing.assert_close(ours, expected, **TOLERANCE[dtype])
            except AssertionError as exc:
                failures.append(f"{shape} {dtype}: {exc}")
    return failures


@pytest.mark.launches
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_reduce_equals_dist_all_reduce(world_size):
    results = launch(compare_ring_with_all_reduce, 1 << 20, world_size=world_size, timeout=90)
    assert results == [[]] * world_size


@pytest.mark.launches
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_plain_ring_all_reduce_equals_dist_all_reduce(world_size):
    results = launch(compare_ring_with_all_reduce, None, SHAPES, True, world_size=world_size, timeout=90)
    assert results == [[]] * world_size


def plain_ring_on_a_subgroup_in_pairs():
    """The plain ring on the group of global ranks [1, 2, 3]: equal to all_reduce, every step one
    send right + receive left batch, addressed to global ranks."""
    rank, members = dist.get_rank(), [1, 2, 3]
    group = dist.new_group(members)  # every rank creates it
    if rank not in members:
        return True
    i = members.index(rank)
    right, left = members[(i + 1) % 3], members[(i - 1) % 3]
    with only_batched_p2p() as batches:
        t = torch.arange(1001, dtype=torch.int64) * 7 + 1000 * rank
        expected = t.clone()
        dist.all_reduce(expected, group=group)
        batches.clear()
        plain_ring_all_reduce(t, group=group)
    pairs = [sorted(b) for b in batches] == [sorted([("isend", right), ("irecv", left)])] * 4
    return torch.equal(t, expected) and pairs


@pytest.mark.launches
def test_plain_ring_on_a_subgroup_posts_one_pair_per_step():
    assert launch(plain_ring_on_a_subgroup_in_pairs, world_size=4, timeout=60) == [True] * 4


@pytest.mark.launches
def test_ring_all_reduce_in_many_segments():
    # 40-byte segments: the chunks of all but the shortest tensors travel in several pieces
    shapes = [s for s in SHAPES if math.prod(s) < 10_000]
    assert launch(compare_ring_with_all_reduce, 40, shapes, world_size=3, timeout=90) == [[]] * 3


def ring_on_subgroups_and_views():
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank creates every group
    mine = pairs[rank % 2]
    t = torch.arange(5, dtype=torch.float64) + 100 * rank
    expected = t.clone()
    dist.all_reduce(expected, group=mine)
    ring_all_reduce(t, group=mine)
    # a non-contiguous view: every other column of a [3, 4] matrix
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
    view = m[:, ::2]
    ring_all_reduce(view)
    return t.tolist() == expected.tolist(), m.tolist()


@pytest.mark.launches
def test_ring_all_reduce_on_a_subgroup_and_a_strided_view():
    results = launch(ring_on_subgroups_and_views, world_size=4, timeout=60)
    assert [same for same, _ in results] == [True] * 4
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for rank, (_, m) in enumerate(results):
        got = torch.tensor(m)
        assert torch.equal(got[:, ::2], base[:, ::2] * (1 + 2 + 3 + 4))  # summed through the view
        assert torch.equal(got[:, 1::2], base[:, 1::2] * (rank + 1))  # the rest untouched


# --- every send posted with its receive (batch_isend_irecv), never alone -------------------


def guard_refuses_lone_p2p():
    """In a rank: the guard stops a lone isend or irecv before it is posted."""
    refused = []
    with only_batched_p2p():
        for post in (dist.isend, dist.irecv):
            try:
                post(torch.zeros(1), 1 - dist.get_rank())
            except LoneP2PError:
                refused.append(post.__name__)
    return refused


@pytest.mark.launches
def test_the_guard_refuses_lone_sends_and_receives():
    assert launch(guard_refuses_lone_p2p, world_size=2, timeout=60) == [["isend", "irecv"]] * 2


# 1 element to 8 MB (int64): below the world size, not divisible by 3 or 4, several 1 MB segments
SIZES = [1, 2, 3, 5, 1001, 65537, 3 * (1 << 18) + 1, (1 << 20) + 3]


def ring_with_only_batched_p2p(sizes, segment_bytes):
    """On every rank, under ``only_batched_p2p``: ring_all_reduce vs dist.all_reduce (int64 exact,
    float32 close) and the batches it posted; what was wrong."""
    rank, w, failures = dist.get_rank(), dist.get_world_size(), []
    right, left = (rank + 1) % w, (rank - 1) % w
    with only_batched_p2p() as batches:
        for i, n in enumerate(sizes):
            for dtype in (torch.int64, torch.float32):
                mine = _random((n,), dtype, seed=1000 * i + rank)
                expected, ours = mine.clone(), mine.clone()
                dist.all_reduce(expected)
                batches.clear()
                ring_all_reduce(ours, segment_bytes=segment_bytes)
                try:
                    torch.testing.assert_close(ours, expected, **TOLERANCE[dtype])
                except AssertionError as exc:
                    failures.append(f"{n} {dtype}: {exc}")
                if any(
                    sorted(b)
                    not in (
                        [("irecv", left)],
                        [("isend", right)],
                        sorted([("isend", right), ("irecv", left)]),
                    )
                    for b in batches
                ):
                    failures.append(f"{n} {dtype}: a batch other than send right + receive left: {batches}")
                one_segment = n >= w and -(-n // w) * mine.element_size() <= segment_bytes
                if one_segment and [len(b) for b in batches] != [2] * (2 * (w - 1)):
                    failures.append(
                        f"{n} {dtype}: expected {2 * (w - 1)} send + receive pairs, got {batches}"
                    )
    return failures


@pytest.mark.launches
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_pairs_every_send_with_its_receive_and_equals_all_reduce(world_size):
    results = launch(ring_with_only_batched_p2p, SIZES, 1 << 20, world_size=world_size, timeout=120)
    assert results == [[]] * world_size


@pytest.mark.launches
def test_ring_pairs_sends_and_receives_in_uneven_segments():
    # 40-byte segments (5 int64): chunks of 6 and 5 elements travel in 2 and 1 segments
    sizes = [1, 2, 3, 16, 17, 101]
    assert launch(ring_with_only_batched_p2p, sizes, 40, world_size=3, timeout=90) == [[]] * 3


def ring_on_a_subgroup_with_only_batched_p2p():
    rank, members = dist.get_rank(), [1, 2, 3]
    group = dist.new_group(members)  # every rank creates it
    if rank not in members:
        return True
    with only_batched_p2p() as batches:
        for n in (1, 2, 4, 1001):
            t = torch.arange(n, dtype=torch.int64) * 7 + 1000 * rank
            expected = t.clone()
            dist.all_reduce(expected, group=group)
            batches.clear()
            ring_all_reduce(t, group=group)
            i = members.index(rank)
            peers = {members[(i + 1) % 3], members[(i - 1) % 3]}  # global ranks
            if not torch.equal(t, expected) or {peer for b in batches for _, peer in b} - peers:
                return False
    return True


@pytest.mark.launches
def test_ring_on_a_subgroup_addresses_global_ranks_in_batches():
    assert launch(ring_on_a_subgroup_with_only_batched_p2p, world_size=4, timeout=60) == [True] * 4


def ring_bad_inputs():
    errors = []
    for bad, kwargs in (
        ([1.0, 2.0], {}),
        (torch.ones(3, dtype=torch.bool), {}),
        (torch.ones(3), {"segment_bytes": 2}),
    ):
        try:
            ring_all_reduce(bad, **kwargs)
        except (TypeError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return errors


@pytest.mark.launches
def test_ring_all_reduce_rejects_bad_input():
    errors = launch(ring_bad_inputs, world_size=2, timeout=60)[0]
    assert errors[0] == "TypeError: ring_all_reduce needs a torch.Tensor, got list"
    assert errors[1].startswith("TypeError: ring_all_reduce sums tensors; dtype torch.bool is not supported")
    assert errors[2].startswith("ValueError: segment_bytes must hold at least one element (4 bytes")
    with pytest.raises(RuntimeError, match="needs an initialised process group"):
        ring_all_reduce(torch.ones(3))


def test_ring_schedule_every_rank_ends_with_every_chunk():
    for w in (2, 3, 4, 5):
        for r in range(w):
            steps = ring_schedule(r, w)
            assert len(steps) == 2 * (w - 1)
            # after reduce-scatter rank r owns chunk (r + 1) % w: its first all-gather send
            assert [s for s in steps if s[0] == "all-gather"][0][2] == (r + 1) % w
            # what rank r sends at a step is what its right neighbour receives at that step
            right = ring_schedule((r + 1) % w, w)
            assert [s[2] for s in steps] == [s[3] for s in right]
            assert {s[3] for s in steps if s[0] == "all-gather"} | {(r + 1) % w} == set(range(w))


# --- every collective demo, against its definition --------------------------------------


@pytest.mark.launches
def test_every_collective_demo_on_four_ranks():
    w = 4
    results = runs.gather_results(launch(runs.run_all, world_size=w, timeout=60))
    start = [[10 * r + i for i in range(w)] for r in range(w)]
    total = [sum(start[r][i] for r in range(w)) for i in range(w)]
    expected_after = {
        "broadcast": [start[0]] * w,
        "all_reduce": [total] * w,
        "all_gather": [[10 * r for r in range(w)]] * w,
        "gather": [[10 * r for r in range(w)]] + [[]] * (w - 1),
        "scatter": [[start[0][r]] for r in range(w)],
        "reduce_scatter": [[total[r]] for r in range(w)],
        "all_to_all": [[start[j][r] for j in range(w)] for r in range(w)],
        "send/recv": [start[r ^ 1] for r in range(w)],
        "isend/irecv": [start[(r - 1) % w] for r in range(w)],
        "barrier": start,
    }
    assert set(results) == set(runs.DEMOS)
    for name, after in expected_after.items():
        assert results[name][1] == after, name
    assert results["reduce"][1][0] == total  # only the destination is promised
    for name in ("all_gather", "gather"):
        assert results[name][0] == [[10 * r] for r in range(w)], name
    for name in set(runs.DEMOS) - {"all_gather", "gather"}:
        assert results[name][0] == start, name


@pytest.mark.launches
def test_barrier_demo_nobody_leaves_before_the_last_arrives():
    per_rank = launch(runs.demo_barrier, world_size=3, timeout=60)
    timing = [extra for _, _, extra in per_rank]
    last = max(t["arrived_s"] for t in timing)
    # Every rank reads the machine's one monotonic clock, arrival before entering the barrier and
    # leaving after it returns: an order of events, exact whatever the load, so no tolerance.
    assert all(t["left_s"] >= last for t in timing), timing
    assert all(t["last_arrival_s"] == last for t in timing), timing  # every rank saw the same times
    assert last >= 0.1, timing  # rank 2 slept 100 ms (at least: time.sleep never wakes early)


@pytest.mark.launches
def test_send_recv_demo_odd_world_leaves_the_last_rank_alone():
    results = runs.gather_results(launch(runs.run_all, world_size=3, timeout=60))
    assert results["send/recv"][1] == [[10, 11, 12], [0, 1, 2], [20, 21, 22]]


def test_picture_and_plot():
    befores, afters = [[0, 1], [10, 11]], [[10, 12], [10, 12]]
    text = runs.picture("all_reduce", befores, afters)
    assert text.splitlines() == [
        "all_reduce(t): every rank gets the element-wise sum (a reduce, then a broadcast).",
        "        before       after",
        "rank 0  [ 0  1]  ->  [10 12]",
        "rank 1  [10 11]  ->  [10 12]",
    ]
    fig = runs.plot({"all_reduce": (befores, afters), "broadcast": (befores, [[0, 1], [0, 1]])})
    assert len([ax for ax in fig.axes if ax.images]) == 4


# --- bandwidth ---------------------------------------------------------------------------


def test_bus_bandwidth_definitions():
    # 64 MB in 0.1 s on 4 ranks: algbw 671 MB/s, busbw = algbw * 2 * 3 / 4
    assert bandwidth.algorithm_bandwidth(64 << 20, 0.1) == pytest.approx((64 << 20) / 0.1)
    assert bandwidth.bus_bandwidth(64 << 20, 0.1, 4) == pytest.approx((64 << 20) / 0.1 * 1.5)
    assert bandwidth.bus_bandwidth(1 << 20, 1.0, 2) == bandwidth.algorithm_bandwidth(1 << 20, 1.0)
    assert bandwidth.bus_bandwidth(1 << 20, 1.0, 1) == 0
    with pytest.raises(ValueError, match="seconds must be positive"):
        bandwidth.algorithm_bandwidth(1, 0)


def test_alpha_beta_fit_recovers_the_model():
    truth = bandwidth.AlphaBeta(alpha=50e-6, beta=1.5e9, world_size=4)  # beta: bytes per second
    sizes = [1 << k for k in range(10, 27, 2)]
    noisy = [truth.seconds(n) * (1 + 0.02 * math.sin(k)) for k, n in enumerate(sizes)]
    fit = bandwidth.fit_alpha_beta(sizes, noisy, 4)
    assert fit.alpha == pytest.approx(truth.alpha, rel=0.1)
    assert fit.beta == pytest.approx(truth.beta, rel=0.1)
    assert fit.latency_share(1 << 10) > 0.99 and fit.latency_share(64 << 20) < 0.01
    assert fit.busbw(1 << 30) == pytest.approx(fit.beta, rel=0.01)  # large messages: beta
    # half the peak bus bandwidth at the size where the two terms are equal, w alpha beta
    assert fit.half_bandwidth_bytes == pytest.approx(4 * fit.alpha * fit.beta)
    assert fit.busbw(fit.half_bandwidth_bytes) == pytest.approx(0.5 * fit.beta, rel=1e-6)
    assert fit.peak_busbw == fit.beta
    with pytest.raises(ValueError, match="world_size >= 2"):
        bandwidth.fit_alpha_beta(sizes, noisy, 1)
    with pytest.raises(ValueError, match="at least two different message sizes"):
        bandwidth.fit_alpha_beta([1024], [1e-4], 2)


def small_sweep():
    return bandwidth.sweep({"gloo": dist.all_reduce, "ring": ring_all_reduce}, [1 << 10, 1 << 16], repeats=2)


@pytest.mark.launches
def test_sweep_rows():
    rows = launch(small_sweep, world_size=2, timeout=60)[0]
    assert [(r["name"], r["nbytes"]) for r in rows] == [
        ("gloo", 1024),
        ("ring", 1024),
        ("gloo", 65536),
        ("ring", 65536),
    ]
    for r in rows:
        assert r["seconds"] > 0 and r["world_size"] == 2
        assert r["busbw"] == pytest.approx(bandwidth.bus_bandwidth(r["nbytes"], r["seconds"], 2))
    fig = bandwidth.plot(rows, {"gloo": bandwidth.AlphaBeta(1e-4, 1e9, 2)})
    assert len(fig.axes[0].lines) == 4  # two implementations, the fit, and its beta


def modeled_sweep(sizes):
    return bandwidth.sweep({"all_reduce": dist.all_reduce}, sizes, repeats=2, max_calls=3, device="meta")


@pytest.mark.launches
@pytest.mark.parametrize("device, network, ranks", [("h100", "nvlink", 4), ("t4", "pcie-gen3", 2)])
def test_sweep_on_a_modeled_cluster_is_the_network_model_exactly(device, network, ranks):
    """Under a cluster the stopwatch reads virtual time: every figure is the ring's alpha-beta time,
    at real sizes (meta tensors), the same on every rank and repeat; the fit reads back alpha, beta."""
    from course_utils.runtime.cluster import Cluster, collective_seconds

    cluster = Cluster(device, network)
    alpha, beta = cluster.network.link(list(range(ranks)))
    sizes = [1 << 10, 1 << 20, 1 << 30, 8 << 30]
    per_rank = launch(modeled_sweep, sizes, world_size=ranks, cluster=cluster, timeout=120)
    assert all(rows == per_rank[0] for rows in per_rank)
    rows = per_rank[0]
    for r in rows:
        ns = round(collective_seconds("all_reduce", r["nbytes"], ranks, alpha, beta) * 1e9)
        assert r["seconds"] == pytest.approx(ns / 1e9, rel=1e-12, abs=1e-15)
    fit = bandwidth.fit_alpha_beta([r["nbytes"] for r in rows], [r["seconds"] for r in rows], ranks)
    assert fit.alpha == pytest.approx(alpha, rel=1e-4) and fit.beta == pytest.approx(beta, rel=1e-4)
    busbw = [r["busbw"] for r in rows]
    assert busbw == sorted(busbw) and beta * 0.99 < busbw[-1] <= beta  # rises, then flattens at beta


def test_published_figures_and_the_models_error():
    from course_utils.collectives import published
    from course_utils.runtime.cluster import NETWORKS, collective_seconds

    ring, nvls, a100 = published.NCCL_ALL_REDUCE
    assert (ring.busbw_GBps, nvls.busbw_GBps, nvls.algbw_GBps, a100.busbw_GBps) == (370, 480, 275, 230)
    link = NETWORKS["nvlink"]
    assert ring.line_rate_GBps * 1e9 == link.bandwidth_Bps  # the preset is the node's line rate
    seconds = collective_seconds("all_reduce", ring.nbytes, 8, link.latency_s, link.bandwidth_Bps)
    busbw = 2 * 7 / 8 * ring.nbytes / seconds / 1e9
    assert published.model_error(busbw, ring.busbw_GBps) == pytest.approx(busbw / 370 - 1)
    assert round(published.model_error(busbw, ring.busbw_GBps), 3) == 0.214  # the chapter's +21.4 %
    assert round(published.model_error(busbw, nvls.busbw_GBps), 3) == -0.064
    with pytest.raises(ValueError, match="positive"):
        published.model_error(1.0, 0)


def test_size_label():
    labels = [bandwidth.size_label(n) for n in (512, 2048, 3 << 20, 8 << 30)]
    assert labels == ["512 B", "2 KiB", "3 MiB", "8 GiB"]


# --- starting a group: clear errors -------------------------------------------------------


def init_alone(port, timeout, rank=0):
    try:
        init_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timeout)
    except GroupInitError as exc:
        return exc.reason, str(exc)
    return None


@pytest.mark.launches
def test_a_rank_that_never_joins():
    port = free_port()
    reason, message = launch(init_alone, port, 1, world_size=1, init_group=False, timeout=60)[0]
    assert reason == "ranks missing"
    assert message.startswith(f"only 1 of 2 ranks joined the group at 127.0.0.1:{port} within 1 s")


@pytest.mark.launches
def test_a_rank_whose_rank_0_never_starts():
    port = free_port()
    reason, message = launch(
        init_alone, port, 1, 1, world_size=1, init_group=False, timeout=60, show_output=False
    )[0]
    assert reason == "ranks missing"
    assert message.startswith(f"nobody answered at 127.0.0.1:{port} within 1 s. Rank 0 hosts the rendezvous")


def test_other_init_errors_are_not_disguised():
    with pytest.raises(ValueError, match="unknown backend 'glo'"):
        init_group("glo", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="No rendezvous handler for bogus://") as info:
        init_group("gloo", init_method="bogus://x", rank=0, world_size=1)
    assert not isinstance(info.value, GroupInitError)  # passed on as PyTorch raised it


@pytest.mark.launches
def test_a_port_already_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        reason, message = launch(init_alone, port, 5, world_size=1, init_group=False, timeout=60)[0]
    assert reason == "port in use"
    assert message.startswith(f"the rendezvous address 127.0.0.1:{port} is already in use")


def init_without_torchrun():
    import os

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    try:
        init_group("gloo")
    except GroupInitError as exc:
        return exc.reason, str(exc)


@pytest.mark.launches
def test_env_init_without_torchrun_names_the_missing_variables():
    reason, message = launch(init_without_torchrun, world_size=1, init_group=False, timeout=60)[0]
    assert reason == "environment"
    assert message.startswith(
        "init_method='env://' reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
        "from the environment, and they are not set. Start the script with torchrun"
    )


def test_a_world_size_the_devices_cannot_serve():
    with pytest.raises(ValueError, match="backend='nccl' needs"):
        init_group("nccl", init_method="tcp://127.0.0.1:1", rank=0, world_size=4096)
    assert not dist.is_initialized()


# --- what needs ranks behind a quiz answer (the rest: tests/quiz_figures/chapter02.py) -------


@pytest.mark.launches
def test_all_to_all_transposes_the_pieces_as_quiz_02_says():
    from course_utils import quiz

    after = launch(runs.demo_all_to_all, world_size=4, timeout=60)[1][1]
    q = quiz.load(2).questions[3]
    assert q.options[q.answer] == f"`{after}`"


def test_bytes_sent_per_rank_with_uneven_chunks():
    from course_utils.collectives import bytes_sent_per_rank

    assert bytes_sent_per_rank(7, 4, 3, rank=0) == 4 * (3 + 2 + 2 + 3)  # chunks [3, 2, 2]


def _unconstrained_alpha_beta(sizes, seconds, w):
    """The relative-error least-squares fit with no sign constraint, as a check on the data."""
    design = torch.tensor([[2.0 * (w - 1), 2.0 * (w - 1) / w * n] for n in sizes], dtype=torch.float64)
    weights = 1 / torch.tensor(seconds, dtype=torch.float64).unsqueeze(1)
    ones = torch.ones(len(sizes), 1, dtype=torch.float64)
    return torch.linalg.lstsq(design * weights, ones).solution.squeeze(1)


def test_alpha_beta_fit_never_gives_a_negative_term():
    """Noisy times on an oversubscribed machine can make the free fit's alpha or beta negative; the fit
    sets that term to 0 and refits the other alone, which then matches the times' level."""
    sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 22]
    falling = [9e-3, 8e-3, 8e-3, 7e-3]  # larger messages faster: noise, not a model
    assert _unconstrained_alpha_beta(sizes, falling, 4)[1] < 0
    fit = bandwidth.fit_alpha_beta(sizes, falling, 4)
    assert fit.beta == math.inf and fit.peak_busbw == math.inf and fit.half_bandwidth_bytes == math.inf
    assert 6 * fit.alpha == pytest.approx(8e-3, rel=0.1)  # six steps of alpha: about the times' level
    doubling = [1 << 20, 1 << 21, 1 << 22, 1 << 23]
    steep = [1e-3 * 4**k for k in range(4)]  # 4x the time for 2x the bytes: the free alpha is negative
    assert _unconstrained_alpha_beta(doubling, steep, 2)[0] < 0
    fit = bandwidth.fit_alpha_beta(doubling, steep, 2)
    assert fit.alpha == 0 and fit.beta > 0 and fit.half_bandwidth_bytes == 0


# --- uneven all-to-all and all-gather (collectives.uneven) -----------------------------------


def uneven_exchange():
    """Rank r sends (r + j) % 3 values to rank j, each value 10 r + j; and gathers arange(r + 1)."""
    from course_utils.collectives import uneven
    from course_utils.runtime.hardware import rank_device

    r, w = dist.get_rank(), dist.get_world_size()
    send = [(r + j) % 3 for j in range(w)]
    values = torch.cat([torch.full((n, 2), 10.0 * r + j) for j, n in enumerate(send)]).to(rank_device())
    received, counts = uneven.all_to_all_uneven(values, send)
    parts = uneven.all_gather_uneven(torch.arange(float(r + 1), device=rank_device()))
    return counts, received.cpu(), [p.cpu() for p in parts]


def check_uneven_exchange(per_rank):
    w = len(per_rank)
    for r, (counts, received, parts) in enumerate(per_rank):
        assert counts == [(j + r) % 3 for j in range(w)]  # what rank j sends to r
        expected = torch.cat([torch.full(((j + r) % 3, 2), 10.0 * j + r) for j in range(w)])
        assert torch.equal(received, expected)
        assert [p.tolist() for p in parts] == [list(map(float, range(j + 1))) for j in range(w)]


@pytest.mark.launches
@pytest.mark.parametrize("world_size", [2, 3])
def test_all_to_all_uneven_and_all_gather_uneven(world_size):
    check_uneven_exchange(launch(uneven_exchange, world_size=world_size, timeout=60))


def uneven_bad_counts():
    from course_utils.collectives import uneven

    errors = []
    for values, send in ((torch.zeros(3), [1, 1]), (torch.zeros(2), [1, 1, 0])):
        try:
            uneven.all_to_all_uneven(values, send)
        except ValueError as err:
            errors.append(str(err))
    return errors


@pytest.mark.launches
def test_all_to_all_uneven_rejects_counts_that_do_not_fit():
    errors = launch(uneven_bad_counts, world_size=2, timeout=60)[0]
    assert "values has 3 rows, send_counts adds up to 2" in errors[0]
    assert "one count per rank (2), got 3" in errors[1]


# --- what work.wait() orders (collectives.streams): the CPU twin of tests/gpu ---------------


@pytest.mark.launches
def test_wait_on_gloo_blocks_the_host_until_the_work_is_done():
    from course_utils.collectives import streams

    for r in launch(streams.wait_semantics, 0.2, world_size=2, backend="gloo", timeout=60):
        assert r["completed_at_wait"] is True and r["value"] == 2.0
        assert r["host_wait_s"] >= 0.2 and r["device_s"] >= 0.2  # the "device" is the host here


# --- the flight recorder (collectives.flight_recorder) on gloo ------------------------------


def skip_a_collective():
    """Rank 1 leaves out the third collective; rank 0 times out in it after 1 s."""
    import os
    from datetime import timedelta

    from course_utils.collectives import flight_recorder

    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # torch 2.9's default is 0 (off); read at first use
    dist.init_process_group("gloo", timeout=timedelta(seconds=1))
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    if dist.get_rank() == 0:
        with contextlib.suppress(RuntimeError):
            dist.all_reduce(torch.ones(8))
    return flight_recorder.recorded_collectives()


@pytest.mark.launches
def test_the_flight_recorder_names_the_collective_a_rank_never_reached():
    from course_utils.collectives import flight_recorder

    traces = launch(skip_a_collective, world_size=2, init_group=False, timeout=60)
    assert [name for _, name, _ in traces[0]] == ["gloo:all_reduce", "gloo:broadcast", "gloo:all_reduce"]
    assert flight_recorder.first_divergence(traces) == (
        "collective #3 (gloo:all_reduce, sizes [[8]]): reached by rank(s) [0], never by rank(s) [1]"
    )


def test_first_divergence_of_recorded_traces():
    from course_utils.collectives.flight_recorder import first_divergence

    a = [(1, "nccl:all_reduce", [[4]]), (2, "nccl:broadcast", [[4]])]
    b = [(1, "nccl:all_reduce", [[4]]), (2, "nccl:all_reduce", [[4]])]
    assert first_divergence([a, a]) == "all 2 ranks recorded the same 2 collectives"
    assert first_divergence([a, b]) == (
        "collective #2 differs between ranks: rank 0: nccl:broadcast [[4]]; rank 1: nccl:all_reduce [[4]]"
    )
    assert first_divergence([a, a[:1], a]).endswith("reached by rank(s) [0, 2], never by rank(s) [1]")
