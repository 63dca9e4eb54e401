"""Exercise: a row-wise sharded embedding-bag lookup, checked against ``F.embedding_bag``.

One table of ``num_embeddings`` rows is split by rows over the ``W`` ranks: rank ``r`` holds rows
``r * R`` to ``(r + 1) * R - 1`` with ``R = ceil(num_embeddings / W)`` (the last rank fewer), the
range split of ``course_utils.sharding``. The learner writes ``row_wise_lookup(local_rows, ids,
offsets, num_embeddings)``: each rank passes its own rows ``[rows here, D]`` and its own batch of
bags (``ids [L]`` global ids, ``offsets [B]`` where each bag starts, as ``F.embedding_bag`` takes
them) and gets back ``[B, D]``, the sum of each of its bags' rows, whichever rank holds them:
ids travel to their owners, partial sums travel back (``sharding.row_wise`` does it for many
tables at once).

``check_row_wise_lookup(fn)`` runs it on 3 gloo ranks (10 rows of 4 values: shards of 4, 4 and 2
rows; 4 bags per rank, one of them empty) and compares each rank's result with
``F.embedding_bag(ids, full_table, offsets, mode="sum")``.

Taught in chapter 07 (section 5, row-wise sharding).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional as F

from course_utils.exercises.ranks import first_error, run_candidates
from course_utils.exercises.result import CheckResult, close, show_values

__all__ = ["check_row_wise_lookup", "check_row_wise_lookup_many", "WORLD_SIZE", "NUM_EMBEDDINGS", "DIM"]

WORLD_SIZE, NUM_EMBEDDINGS, DIM = 3, 10, 4
BAG_LENGTHS = ((2, 3, 1, 2), (2, 0, 3, 1), (1, 4, 2, 2))  # per rank: its 4 bags' sizes


def full_table() -> torch.Tensor:
    """The whole table ``[NUM_EMBEDDINGS, DIM]``: small integers, so sums are exact."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(-9, 10, (NUM_EMBEDDINGS, DIM), generator=generator).float()


def rows_per_rank() -> int:
    return -(-NUM_EMBEDDINGS // WORLD_SIZE)


def rank_batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s bags: ``ids [L]`` (every shard's rows among them) and ``offsets [B]``."""
    lengths = torch.tensor(BAG_LENGTHS[rank])
    generator = torch.Generator().manual_seed(10 + rank)
    ids = torch.randint(0, NUM_EMBEDDINGS, (int(lengths.sum()),), generator=generator)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return ids, offsets


def _body(fn) -> dict:
    rank = dist.get_rank()
    table, size = full_table(), rows_per_rank()
    ids, offsets = rank_batch(rank)
    got = fn(table[rank * size : (rank + 1) * size].clone(), ids.clone(), offsets.clone(), NUM_EMBEDDINGS)
    return {"got": got.detach().clone() if isinstance(got, torch.Tensor) else got}


def _only_rows_of(owner: int, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The bag sums counting only the rows that rank ``owner`` holds."""
    weights = (ids // rows_per_rank() == owner).float()
    return F.embedding_bag(ids, full_table(), offsets, mode="sum", per_sample_weights=weights)


def _diagnose(outcomes) -> str | None:
    table, size = full_table(), rows_per_rank()
    expected = [
        F.embedding_bag(ids, table, offsets, mode="sum")
        for ids, offsets in map(rank_batch, range(WORLD_SIZE))
    ]
    for o in outcomes:
        r, got = o.rank, o.data["got"]
        ids, offsets = rank_batch(r)
        want = expected[r]
        where = f"rank {r}"
        if not isinstance(got, torch.Tensor):
            return (
                f"{where}: row_wise_lookup returned {type(got).__name__}, not a tensor "
                f"[B, D] = {list(want.shape)}"
            )
        if got.shape != want.shape:
            return (
                f"{where}: row_wise_lookup returned shape {list(got.shape)}; expected {list(want.shape)}, "
                f"one row of {DIM} values per bag of this rank ({len(offsets)} bags)"
            )
        if close(got, want):
            continue
        if close(got, F.embedding_bag(ids, table, offsets, mode="mean")):
            return (
                f"{where}: each bag is the mean of its rows, not their sum: the lookup pools with "
                "mode 'sum' (add the rows; do not divide by the bag's length)"
            )
        for owner in range(WORLD_SIZE):
            if close(got, _only_rows_of(owner, ids, offsets)):
                if owner == r:
                    return (
                        f"{where}: its bags hold only the rows rank {r} owns: the ids owned by other "
                        "ranks were never looked up there (send each id to its owner, id // "
                        f"{size}, and add up the partial sums that come back)"
                    )
                return (
                    f"{where}: its bags hold only the rows rank {owner} owns: add up the partial sums "
                    "from every owner, not from one"
                )
        for other in range(WORLD_SIZE):
            if other != r and close(got, expected[other]):
                return (
                    f"{where} got rank {other}'s bag sums: the partial sums went back to the wrong "
                    "rank (send back to each rank the sums of the ids it sent you)"
                )
        bag = int((got - want).abs().sum(1).argmax())
        end = offsets[bag + 1] if bag + 1 < len(offsets) else len(ids)
        return (
            f"{where}: bag {bag} (ids {ids[offsets[bag] : end].tolist()}) is {show_values(got[bag])}, "
            f"expected {show_values(want[bag])}"
        )
    return None


def _result(outcomes) -> CheckResult:
    result = CheckResult(
        "row_wise_lookup",
        f"gives F.embedding_bag's sums on the full table on each of {WORLD_SIZE} ranks "
        f"({NUM_EMBEDDINGS} rows split {rows_per_rank()}, {rows_per_rank()}, "
        f"{NUM_EMBEDDINGS - 2 * rows_per_rank()}; 4 bags per rank, one empty)",
    )
    problem = first_error(outcomes, "row_wise_lookup")
    if problem and ("out of" in problem or "index" in problem.lower()):
        size = rows_per_rank()
        problem += (
            f". A rank looked up a row its shard does not have: rank r holds rows r * {size} to "
            f"r * {size} + {size - 1} (the last rank fewer); id i lives on rank i // {size}, at row "
            f"i - (i // {size}) * {size} of its local_rows"
        )
    problem = problem or _diagnose(outcomes)
    result.note(problem)
    return result


def check_row_wise_lookup_many(fns: list, wait_s: float = 5.0) -> list[CheckResult]:
    """``check_row_wise_lookup`` for several functions in one launch (nothing printed)."""
    return [_result(o) for o in run_candidates(_body, fns, world_size=WORLD_SIZE, wait_s=wait_s)]


def check_row_wise_lookup(fn, wait_s: float = 5.0) -> CheckResult:
    """Run ``fn(local_rows, ids, offsets, num_embeddings)`` on 3 gloo ranks against
    ``F.embedding_bag`` on the full table; print what differs, or one line saying it passed."""
    return check_row_wise_lookup_many([fn], wait_s)[0].shown()
