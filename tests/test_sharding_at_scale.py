"""Appendix 07c: table-row-wise, grid and replicated tables against nn.EmbeddingBag, 2-D sparse
parallelism against one process, their bytes against the formulas, and their modeled times
(course_utils.sharding: table_row_wise, grid, replicated_tables, two_d, link_bytes, scale_runs)."""

import pytest
import torch

from course_utils import Cluster, launch
from course_utils.sharding import link_bytes, make_plan, scale_runs, two_d, volume
from course_utils.sharding.table_row_wise import TableRowWiseEmbeddingBags
from course_utils.workload import data

pytestmark = pytest.mark.chapter(7)

CARDS = [50, 7, 300, 13, 90]  # uneven sizes: uneven row blocks, a table smaller than a host
DIM, BATCH, POOLING = 8, 6, 3
FORWARD_TOL, GRAD_TOL = 1e-5, 1e-5  # partial sums added in another order than EmbeddingBag's
CASES = [
    ("table_row_wise", {"ranks_per_host": 2}),
    ("table_row_wise", {"ranks_per_host": 1}),  # 4 hosts of 1: table-wise across hosts
    ("table_row_wise", {"ranks_per_host": 4}),  # 1 host of 4: row-wise inside it
    ("grid_shard", {"ranks_per_host": 2}),
    ("grid_shard", {"ranks_per_host": 2, "column_blocks": 4}),
    ("data_parallel", {}),
]
STEPS, LR = 4, 0.5
TRAIN_TOL = 1e-6  # float32 sums in another order than one process's


def _ids(world):
    _, ids, _ = scale_runs.problem(CARDS, DIM, world, BATCH, POOLING)
    return list(ids.split(BATCH))


@pytest.mark.launches
def test_lookups_equal_embedding_bag_and_bytes_equal_formulas():
    results = launch(scale_runs.compare_kinds, CASES, CARDS, DIM, BATCH, POOLING, world_size=4, timeout=120)
    for i, (kind, options) in enumerate(CASES):
        per_rank = [r[i] for r in results]
        assert max(r["forward"] for r in per_rank) <= FORWARD_TOL, (kind, options)
        assert max(r["grad"] for r in per_rank) <= GRAD_TOL, (kind, options)
        plan = make_plan(kind, CARDS, DIM, 4, **options)
        metered = link_bytes.measured([r["traffic"] for r in per_rank])
        assert metered == link_bytes.matrices(plan, _ids(4)), (kind, options)  # every pair, every phase
        assert link_bytes.totals(metered) == link_bytes.closed_form(plan, _ids(4))


TRAININGS = [  # (kind, sync, every, layout)
    ("row_wise", "gradients", 1, "contiguous"),
    ("table_wise", "weights", 1, "strided"),
    ("column_wise", "weights", 2, "contiguous"),
]


def _train_all(tables, logs, readout):
    return [
        two_d.train_two_d(
            kind,
            tables,
            logs,
            readout,
            group_size=2,
            batch=BATCH,
            steps=STEPS,
            lr=LR,
            sync=sync,
            every=every,
            layout=layout,
        )
        for kind, sync, every, layout in TRAININGS
    ]


@pytest.mark.launches
def test_two_d_trains_as_one_process_and_bytes_equal_formula():
    world = 4
    g = torch.Generator().manual_seed(0)
    tables = [torch.randn(n, DIM, generator=g) * 0.1 for n in CARDS]
    readout = torch.randn(DIM, generator=g)
    logs = data.make_click_logs(world * BATCH * STEPS, seed=0, cardinalities=CARDS, n_dense=1)
    runs = launch(_train_all, tables, logs, readout, world_size=world, timeout=120)
    reference = two_d.train_one_process(tables, logs, readout, world=world, batch=BATCH, steps=STEPS, lr=LR)
    last = list(torch.from_numpy(logs.sparse[(STEPS - 1) * world * BATCH :]).view(world, BATCH, -1))
    for i, (kind, _, every, layout) in enumerate(TRAININGS):
        results = [r[i] for r in runs]
        gap = max(
            (w - s.of(reference[s.table])).abs().max().item()
            for r in results
            for s, w in r["shards"]
            if w.numel()
        )
        if every == 1:
            assert gap <= TRAIN_TOL, kind
        else:  # averaging the weights every 2 steps is another algorithm (local SGD): it drifts
            assert gap > 100 * TRAIN_TOL, kind
        expected = link_bytes.two_d_matrices(make_plan(kind, CARDS, DIM, 2), world, last, layout)
        assert link_bytes.measured([r["traffic"] for r in results]) == expected, kind


TIMED = [("table_row_wise", {"ranks_per_host": 2}), ("row_wise", {}), ("data_parallel", {})]


def _timed_all():
    return [scale_runs.timed_collectives(kind, options, CARDS, DIM, BATCH) for kind, options in TIMED]


@pytest.mark.launches
def test_price_equals_the_modeled_clusters_own_timing():
    """On 4 real ranks of a modeled cluster (2 hosts of 2), each all-to-all the cluster times equals
    what ``price`` gives from the metered bytes."""
    cluster = Cluster("h100", "infiniband", gpus_per_node=2)
    runs = launch(_timed_all, world_size=4, timeout=120, cluster=cluster)
    for i, (kind, _) in enumerate(TIMED):
        results = [r[i] for r in runs]
        priced = scale_runs.price(kind, link_bytes.measured([r["traffic"] for r in results]), cluster)
        timed = [max(ns) for ns in zip(*(r["ns"] for r in results), strict=True)]
        steps = [round(seconds * 1e9) for name, seconds in priced.items() if name != "total"]
        if kind == "data_parallel":  # one all-reduce: a reduce-scatter and an all-gather
            timed = [sum(timed)]
        assert timed == steps, kind


def test_table_row_wise_refuses_a_group():
    plan = make_plan("table_row_wise", CARDS, DIM, 2, ranks_per_host=2)
    with pytest.raises(ValueError, match="span all ranks"):
        TableRowWiseEmbeddingBags(plan, group=object())  # refused before any process group is needed


def test_plans_refuse_bad_shapes_in_one_line():
    with pytest.raises(ValueError, match="whole number of hosts"):
        make_plan("table_row_wise", CARDS, DIM, 6, ranks_per_host=4)
    with pytest.raises(ValueError, match="equal column blocks"):
        make_plan("grid_shard", CARDS, 6, 4, ranks_per_host=1)
    with pytest.raises(ValueError, match="without a piece"):
        make_plan("table_row_wise", CARDS[:2], DIM, 4, ranks_per_host=1)


@pytest.mark.parametrize("world, per_host", [(4, 2), (8, 2), (8, 4), (6, 3)])
def test_closed_forms_sum_the_matrices(world, per_host):
    ids = _ids(world)
    for kind, options in [
        ("table_row_wise", {"ranks_per_host": per_host}),
        ("grid_shard", {"ranks_per_host": per_host, "column_blocks": 2}),
        ("data_parallel", {}),
    ]:
        plan = make_plan(kind, CARDS, DIM, world, **options)
        assert link_bytes.totals(link_bytes.matrices(plan, ids)) == link_bytes.closed_form(plan, ids)


@pytest.mark.parametrize("kind", ["table_wise", "row_wise", "column_wise"])
def test_matrices_agree_with_chapter_07s_formula(kind):
    plan = make_plan(kind, CARDS, DIM, 4)
    ids = _ids(4)
    routed = volume.routed_ids(plan, ids) if kind == "row_wise" else None
    assert link_bytes.totals(link_bytes.matrices(plan, ids)) == volume.formula(
        kind, BATCH, len(CARDS), DIM, 4, POOLING, routed
    )


def test_pricing_uses_the_host_tier_inside_a_host():
    """One host: every collective on NVLink; 2-D on one host is its inner kind (nothing to sync)."""
    cluster = Cluster("h100", "infiniband", gpus_per_node=4)
    ids = _ids(4)
    plan = make_plan("row_wise", CARDS, DIM, 4)
    flat = scale_runs.price("row_wise", link_bytes.matrices(plan, ids), cluster)
    two = scale_runs.price("2d:row_wise", link_bytes.two_d_matrices(plan, 4, ids), cluster)
    assert flat["total"] == two["total"] > 0
    nvlink = Cluster("h100", "nvlink").network
    assert flat["all_to_all counts world"] == pytest.approx(3 * nvlink.latency_s + 24 / nvlink.bandwidth_Bps)
