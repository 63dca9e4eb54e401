"""Sharded embedding lookups (table-, row-, column-wise) against the unsharded EmbeddingBag,
forward and backward, and the bytes they move against the formula (course_utils.sharding)."""

import pytest
import torch
import torch.distributed as dist

from course_utils import launch, sharding

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


def test_table_wise_with_fewer_tables_than_ranks():
    """Ranks 2 and 3 own no table, yet take part in both all-to-alls, forward and backward."""
    results = launch(_compare, "table_wise", {}, CARDS[:2], world_size=4, timeout=120)
    for pooling in (1, 3):
        assert all(r[pooling]["shape"] == (BATCH, 2, DIM) for r in results)
        assert max(r[pooling]["forward"] for r in results) <= FORWARD_TOL
        assert max(r[pooling]["grad"] for r in results) <= GRAD_TOL


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


def test_quiz_07_answers_are_what_the_code_computes():
    from course_utils import quiz
    from course_utils.workload import data

    answers = {q.number: q.options[q.answer] for q in quiz.load(7).questions}
    assert answers[1] == f"{sharding.formula('table_wise', 1000, 10, 32, 4)['embeddings']:,}"
    ratio = (
        sharding.formula("row_wise", 1000, 10, 32, 8, routed=[[0] * 8] * 8)["embeddings"]
        / sharding.formula("table_wise", 1000, 10, 32, 8)["embeddings"]
    )
    assert answers[2] == f"{ratio:g}"
    logs = data.make_click_logs(2048, seed=0)
    routed = sharding.routed_ids(
        sharding.plan_row_wise(logs.cardinalities, 16, 4, split="range"),
        list(torch.from_numpy(logs.sparse).split(512)),
    )
    received = [sum(row[s] for row in routed) for s in range(4)]
    assert received.index(max(received)) == 0 and answers[5].startswith("Rank 0")
    plain = sharding.MemoryBudget(1, optimizer="adam").training_bytes(100_000 * 16)
    fused = 4 * (100_000 * 16 + 100_000)  # weights + one row-wise Adagrad float per row, no gradient
    assert answers[7] == f"{plain:,} and {fused:,}"


def test_the_busiest_rank_sets_the_pace_not_the_total():
    from course_utils.sharding import busiest_rank_bytes

    # rank 0 sends 10 ids-bytes to rank 1 and 90 embedding-bytes; rank 1 sends 30 and 10
    traffic = [{"ids": [0, 10], "embeddings": [0, 90]}, {"ids": [30, 0], "embeddings": [10, 0]}]
    assert busiest_rank_bytes(traffic) == 30 + 90  # per phase the larger of any rank's sent or received
    balanced = [{"ids": [0, 20]}, {"ids": [20, 0]}]
    assert busiest_rank_bytes(balanced) == 20  # = total / W when balanced
