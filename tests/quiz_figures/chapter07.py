"""Sources of the numbers in quiz 07's answers (see tests/test_quiz_figures.py)."""

ROWS, DIM = 100_000, 16  # question 7's table


def _pooled(kind: str, world_size: int) -> int:
    """Bytes of pooled embeddings one forward moves, summed over the ranks: 1,000 rows per rank,
    10 tables of dimension 32 (question 1); row-wise with every id on rank 0."""
    from course_utils.sharding import formula

    routed = [[0] * world_size] * world_size if kind == "row_wise" else None
    return formula(kind, 1000, 10, 32, world_size, routed=routed)["embeddings"]


def _bytes_across_hosts(kind: str, hosts: int = 4, per_host: int = 8) -> int:
    """Question 2: pooled-embedding bytes one forward sends between hosts, measured on the link
    matrix of ``hosts`` hosts of ``per_host`` ranks (8 tables of 64 rows, dimension 4, 3 rows per rank)."""
    import torch

    from course_utils.sharding import link_bytes, make_plan

    world, cards = hosts * per_host, [64] * 8
    generator = torch.Generator().manual_seed(0)
    ids = [
        torch.stack([torch.randint(0, c, (3,), generator=generator) for c in cards], 1) for _ in range(world)
    ]
    options = {"ranks_per_host": per_host} if kind == "table_row_wise" else {}
    plan = make_plan(kind, cards, 4, world, **options)
    embeddings = {"embeddings": link_bytes.matrices(plan, ids)["embeddings"]}
    return link_bytes.across_hosts(embeddings, per_host)[0]


def _adam_bytes() -> int:
    """Question 7: a plain loop with Adam holds weights, gradients and two moments."""
    from course_utils.sharding import MemoryBudget

    return MemoryBudget(1, optimizer="adam").training_bytes(ROWS * DIM)


def _range_split_loads_rank_0_most() -> bool:
    """Question 5: Zipf ids under a row-wise range split over 4 ranks: rank 0 receives the most."""
    import torch

    from course_utils import sharding
    from course_utils.workload import data

    logs = data.make_click_logs(2048, seed=0)
    plan = sharding.plan_row_wise(logs.cardinalities, 16, 4, split="range")
    routed = sharding.routed_ids(plan, list(torch.from_numpy(logs.sparse).split(512)))
    received = [sum(row[s] for row in routed) for s in range(4)]
    return received.index(max(received)) == 0


FIGURES = {
    1: {
        "3,840,000": Computed(lambda: _pooled("table_wise", 4)),
        "1,280,000": Computed(lambda: _pooled("table_wise", 4) / 3),  # A: without the factor W - 1
        "5,120,000": Computed(lambda: _pooled("table_wise", 4) / 3 * 4),  # B: a factor W instead
        "15,360,000": Computed(lambda: _pooled("row_wise", 4)),  # C
    },
    2: {
        "24": Computed(lambda: 32 - 8),  # the ranks on the other 3 hosts
        "3": Computed(lambda: 4 - 1),  # of 4 hosts, the ones a table does not live on
    },
    5: {
        "2.49": InChapter("range split: lookups per rank"),
        "1.42": InChapter("hash  split: lookups per rank"),
    },
    7: {
        "25,600,000": Computed(_adam_bytes),
        "6,800,000": Computed(lambda: 4 * (ROWS * DIM + ROWS)),  # weights + one Adagrad float per row
        "1.6": Computed(lambda: ROWS * DIM / 1e6),  # million values
        "6,400,000": Computed(lambda: 4 * ROWS * DIM),
        "400,000": Computed(lambda: 4 * ROWS),
        "12,800,000": Computed(lambda: 4 * 2 * ROWS * DIM),  # C: one Adagrad value per weight
        "19,200,000": Computed(lambda: _adam_bytes() * 3 / 4),  # D: three copies
        "32.2": InChapter("training state with Adam: tables"),
        "8.18": InChapter("tables with the optimizer fused into backward, row-wise Adagrad"),
    },
}

CLAIMS = {
    2: (
        Claim("C. 32", lambda: _bytes_across_hosts("row_wise") == 32 * _bytes_across_hosts("table_row_wise")),
        Claim(
            "as under table-wise",
            lambda: _bytes_across_hosts("table_row_wise") == _bytes_across_hosts("table_wise"),
        ),
    ),
    5: (Claim("D. Rank 0", _range_split_loads_rank_0_most),),
}
