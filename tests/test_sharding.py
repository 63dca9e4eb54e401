"""Sharded embedding lookups (table-, row-, column-wise) against the unsharded EmbeddingBag,
forward and backward, and the bytes they move against the formula (course_utils.sharding)."""

import pytest
import torch
import torch.distributed as dist

from course_utils import launch, sharding

pytestmark = pytest.mark.chapter(7)

CARDS = [50, 7, 300, 13, 90]  # uneven sizes: uneven row blocks, a table smaller than W
DIM, BATCH = 8, 6
CASES = [
    ("table_wise", {}),
    ("column_wise", {}),
    ("row_wise", {"split": "range"}),
    ("row_wise", {"split": "hash"}),
]
FORWARD_TOL, GRAD_TOL = 1e-6, 1e-5  # row-wise adds partial sums in another order than EmbeddingBag


def _problem(world_size, pooling, cards=CARDS):
    """Tables, every rank's ids and a fixed upstream gradient, the same on every rank."""
    g = torch.Generator().manual_seed(pooling)
    tables = [torch.randn(n, DIM, generator=g) for n in cards]
    ids = torch.stack([torch.randint(0, n, (world_size * BATCH, pooling), generator=g) for n in cards], 1)
    upstream = torch.randn(world_size * BATCH, len(cards), DIM, generator=g)
    return tables, (ids.squeeze(-1) if pooling == 1 else ids), upstream


def _compare(kind, options, cards=CARDS):
    """On each rank: sharded forward/backward on its rows; returns max differences and traffic."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for pooling in (1, 3):
        tables, ids, upstream = _problem(world, pooling, cards)
        lookup = sharding.shard_embeddings(sharding.make_plan(kind, cards, DIM, world, **options), tables)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        pooled = lookup(ids[mine])
        (pooled * upstream[mine]).sum().backward()
        full = [t.clone().requires_grad_(True) for t in tables]
        reference = sharding.lookup_unsharded(full, ids)
        (reference * upstream).sum().backward()
        out[pooling] = {
            "shape": tuple(pooled.shape),
            "forward": (pooled - reference[mine]).abs().max().item(),
            "grad": max(
                [
                    (g - s.of(full[s.table].grad)).abs().max().item() if g.numel() else 0.0
                    for s, g in lookup.shard_gradients()
                ],
                default=0.0,
            ),  # default: a rank without shards
            "traffic": lookup.traffic.as_dict(),
        }
    return out


@pytest.mark.launches
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("kind, options", CASES, ids=["table", "column", "row-range", "row-hash"])
def test_sharded_lookup_equals_unsharded_and_bytes_match_formula(kind, options, world_size):
    results = launch(_compare, kind, options, world_size=world_size, timeout=120)
    plan = sharding.make_plan(kind, CARDS, DIM, world_size, **options)
    for pooling in (1, 3):
        per_rank = [r[pooling] for r in results]
        assert all(r["shape"] == (BATCH, len(CARDS), DIM) for r in per_rank)
        assert max(r["forward"] for r in per_rank) <= FORWARD_TOL
        assert max(r["grad"] for r in per_rank) <= GRAD_TOL
        _, ids, _ = _problem(world_size, pooling)
        routed = sharding.routed_ids(plan, list(ids.split(BATCH))) if kind == "row_wise" else None
        expected = sharding.formula(kind, BATCH, len(CARDS), DIM, world_size, pooling, routed)
        assert sharding.measured([r["traffic"] for r in per_rank]) == expected  # exactly, every phase


@pytest.mark.launches
def test_table_wise_with_fewer_tables_than_ranks():
    """Ranks 2 and 3 own no table, yet take part in both all-to-alls, forward and backward."""
    results = launch(_compare, "table_wise", {}, CARDS[:2], world_size=4, timeout=120)
    for pooling in (1, 3):
        assert all(r[pooling]["shape"] == (BATCH, 2, DIM) for r in results)
        assert max(r[pooling]["forward"] for r in results) <= FORWARD_TOL
        assert max(r[pooling]["grad"] for r in results) <= GRAD_TOL


@pytest.mark.launches
def test_exact_for_one_id_per_table():
    """With one id per bag there is nothing to re-order: every kind is bit-exact."""
    for kind, options in CASES:
        results = launch(_compare, kind, options, world_size=2, timeout=60)
        assert all(r[1]["forward"] == 0.0 for r in results), kind


def test_formula_known_values():
    # table-wise, 2 ranks, B=4, T=3, L=1, D=8: ids 8*4*3*1 = 96, embeddings 4*4*3*8 = 384 each way
    assert sharding.formula("table_wise", 4, 3, 8, 2) == {
        "counts": 0,
        "ids": 96,
        "embeddings": 384,
        "gradients": 384,
        "total": 864,
    }
    # column-wise sends every id to every other rank: W times the table-wise ids
    assert (
        sharding.formula("column_wise", 4, 3, 8, 4)["ids"]
        == 4 * sharding.formula("table_wise", 4, 3, 8, 4)["ids"]
    )
    with pytest.raises(ValueError, match="pass routed=routed_ids"):
        sharding.formula("row_wise", 4, 3, 8, 2)


def test_plans_cover_every_row_and_column_once():
    for kind, options in CASES:
        for world in (1, 2, 3, 4):
            plan = sharding.make_plan(kind, CARDS, DIM, world, **options)
            for t, n in enumerate(CARDS):
                hits = torch.zeros(n, DIM, dtype=torch.int64)
                for s in plan.shards:
                    if s.table == t:
                        s.of(hits).add_(1)
                assert torch.equal(hits, torch.ones_like(hits)), (kind, world, t)


def test_table_wise_balances_bytes_and_row_wise_splits_like_dtensor():
    plan = sharding.plan_table_wise([100, 90, 10, 5], 4, 2)
    assert plan.tables_of(0) == [0, 3] and plan.tables_of(1) == [1, 2]
    rows = [s.rows for s in sharding.plan_row_wise([10], 4, 4).shards]
    assert rows == [(0, 3), (3, 6), (6, 9), (9, 10)]  # torch.chunk / DTensor Shard(0) blocks
    assert [s.cols for s in sharding.plan_column_wise([10], 16, 3).shards] == [(0, 6), (6, 12), (12, 16)]
    assert "rank 1" in plan.describe()


@pytest.mark.launches
def test_bad_plans_and_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="unknown sharding kind 'diagonal'"):
        sharding.make_plan("diagonal", CARDS, DIM, 2)
    with pytest.raises(ValueError, match="leaves a rank without columns"):
        sharding.plan_column_wise(CARDS, 4, 8)
    with pytest.raises(ValueError, match="split must be 'range' or 'hash'"):
        sharding.plan_row_wise(CARDS, DIM, 2, split="random")
    with pytest.raises(RuntimeError, match="inside a function run by course_utils.launch"):
        sharding.shard_embeddings(sharding.plan_table_wise(CARDS, DIM, 2))

    def misuse():
        errors = []
        with pytest.raises(ValueError, match="the plan is for 4 ranks but the process group has 2"):
            sharding.shard_embeddings(sharding.plan_table_wise(CARDS, DIM, 4))
        lookup = sharding.shard_embeddings(sharding.plan_row_wise(CARDS, DIM, 2))
        for bad, error, _message in [
            (torch.zeros(3, 4, dtype=torch.long), ValueError, r"ids must be \[B, 5\]"),
            (torch.zeros(3, 5), TypeError, "ids must be int64"),
            (torch.full((3, 5), 60), IndexError, "table 1 has 7 rows but got ids in"),
        ]:
            try:
                lookup(bad)
            except error as exc:
                errors.append(str(exc))
        return errors

    messages = launch(misuse, world_size=2, timeout=60)[0]
    assert len(messages) == 3 and "hash or clip ids into range" in messages[2]


def test_budget_refuses_what_does_not_fit_before_allocating():
    budget = sharding.MemoryBudget(4 * 2**20, optimizer="adam")  # 4 MiB per rank
    cards = [200_000, 1_000, 1_000]  # table 0: 200k x 16 x 4 B x 4 = 48.8 MiB
    with pytest.raises(
        sharding.BudgetExceededError, match="Table 0 alone needs .*no table-wise plan can fit"
    ):
        budget.check(sharding.plan_table_wise(cards, 16, 16))
    budget.check(sharding.plan_row_wise(cards, 16, 16))  # 1/16 of everything per rank fits
    assert budget.need(sharding.plan_row_wise(cards, 16, 16))[0] == ((12_500 + 63 + 63) * 16) * 4 * 4
    with pytest.raises(ValueError, match="unknown optimizer"):
        sharding.MemoryBudget(1, optimizer="lion")


def test_the_busiest_rank_sets_the_pace_not_the_total():
    from course_utils.sharding import busiest_rank_bytes

    # rank 0 sends 10 ids-bytes to rank 1 and 90 embedding-bytes; rank 1 sends 30 and 10
    traffic = [{"ids": [0, 10], "embeddings": [0, 90]}, {"ids": [30, 0], "embeddings": [10, 0]}]
    assert busiest_rank_bytes(traffic) == 30 + 90  # per phase the larger of any rank's sent or received
    balanced = [{"ids": [0, 20]}, {"ids": [20, 0]}]
    assert busiest_rank_bytes(balanced) == 20  # = total / W when balanced


# --- on a modeled cluster: the values on the meta device, real sizes priced in virtual time ---------


def _modeled_steps(world, kinds=("table_wise", "row_wise", "column_wise")):
    from course_utils import Cluster
    from course_utils.workload import data

    node, out = Cluster("h100", "nvlink"), {}
    for kind in kinds:
        options = {"split": "hash"} if kind == "row_wise" else {}
        out[kind] = launch(
            sharding.modeled_lookup_step, kind, options, data.CRITEO_KAGGLE_CARDINALITIES, 128, 8192,
            world_size=world, cluster=node, timeout=120, show_output=False,
        )  # fmt: skip
    return out


@pytest.mark.launches
def test_modeled_steps_follow_the_busiest_rank_and_move_the_formulas_bytes():
    runs = _modeled_steps(4)  # appendix 07f's section 2 sizes (Criteo's tables at full size), on 4 ranks
    step, busiest = {}, {}
    for kind, ranks in runs.items():
        assert len({r["step_ns"] for r in ranks}) == 1  # barrier to barrier: one step for all
        traffic = [r["traffic"] for r in ranks]
        expected = sharding.formula(kind, 8192, 26, 128, 4, routed=ranks[0]["routed"])
        assert sharding.measured(traffic) == expected  # meta values, real counts
        step[kind], busiest[kind] = ranks[0]["step_ns"], sharding.busiest_rank_bytes(traffic)
        timeline = ranks[0]["timeline"]
        assert timeline.makespan_ns == step[kind] and timeline.on(0, "collectives")
    assert sorted(step, key=step.get) == sorted(busiest, key=busiest.get)
    again = _modeled_steps(4, ("row_wise",))["row_wise"][0]["step_ns"]
    assert again == step["row_wise"]  # virtual time: exact


@pytest.mark.launches
def test_meta_lookups_refuse_nothing_real_and_hold_no_numbers():
    def build():
        plan = sharding.make_plan("row_wise", [40_000_000, 10], 128, 2)
        lookup = sharding.shard_embeddings(plan, device="meta")
        return [tuple(w.shape) for w in lookup.weights], {w.device.type for w in lookup.weights}

    shapes, devices = launch(build, world_size=2, timeout=60, show_output=False)[0]
    assert shapes == [(20_000_000, 128), (5, 128)] and devices == {"meta"}


# --- MLPerf's DLRM-DCNv2 (course_utils.sharding.mlperf) --------------------------------------------


def test_mlperf_placement_covers_every_table_once_and_balances_lookups():
    from course_utils.sharding import mlperf

    dp = mlperf.data_parallel_tables()
    pieces = mlperf.place_pieces(8)
    assert all(mlperf.TABLE_ROWS[t] * 128 * 4 <= 0.008 * 2**30 for t in dp)
    for t in set(range(26)) - set(dp):  # every other table cut into parts 0..k-1, on k ranks
        parts = [p for p in pieces if p.table == t]
        assert sorted(p.part for p in parts) == list(range(parts[0].parts)) and len(
            {p.rank for p in parts}
        ) == len(parts)
    assert {p.table for p in pieces} | set(dp) == set(range(26))
    load = [sum(mlperf.MULTI_HOT[p.table] / p.parts for p in pieces if p.rank == r) for r in range(8)]
    share = sum(mlperf.MULTI_HOT[t] for t in set(range(26)) - set(dp)) / 8
    assert max(load) < 1.25 * share < mlperf.MULTI_HOT[20]  # the 100-id table alone would be 4.5 shares


def test_mlperf_published_step_and_dense_part():
    from course_utils.sharding import mlperf

    gaps = sorted(mlperf.PUBLISHED["train_gaps_ms"])
    assert mlperf.published_step_seconds() == (gaps[7] + gaps[8]) / 2 / 1e3 / 3793
    assert 4_195_197_692 * 0.05 // mlperf.GLOBAL_BATCH == mlperf.PUBLISHED["steps_between_evals"]
    dense = mlperf.DCNv2Dense(device="meta")
    out = dense(torch.empty(4, 13, device="meta"), torch.empty(4, 26, 128, device="meta"))
    assert out.shape == (4,)
    cross = sum(p.numel() for p in dense.cross.parameters())
    assert cross == 3 * (3456 * 512 + 512 * 3456 + 3456)  # three rank-512 layers on 26 x 128 + 128 features


@pytest.mark.launches
def test_mlperf_step_is_exact_and_the_same_on_every_rank():
    from course_utils import Cluster
    from course_utils.sharding import mlperf

    def step():
        return mlperf.mlperf_step(world_batch=2048)

    node = Cluster("h100", "nvlink")
    first = launch(step, world_size=2, cluster=node, timeout=120, show_output=False)
    again = launch(step, world_size=2, cluster=node, timeout=120, show_output=False)
    assert len({r["step_ns"] for r in first + again}) == 1
    pieces = mlperf.place_pieces(2)
    for rank, r in enumerate(first):  # ids out: 8 bytes per id of this rank's 1,024 rows, to the other rank
        other = [p for p in pieces if p.rank != rank]
        assert sum(r["traffic"]["ids"]) == 8 * sum(p.ids(1024) for p in other)
