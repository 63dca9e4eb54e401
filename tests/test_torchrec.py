"""TorchRec's sharded lookups equal F.embedding_bag and the course's sharded lookups, on 2 CPU ranks.

TorchRec is not a course dependency: without it these tests skip, unless
``COURSE_REQUIRE_TORCHREC=1`` (set by ``.ci/run``'s TorchRec part), where a missing or broken
torchrec is a failure.
"""

import os

import pytest

from course_utils.scripts import torchrec_check

MISSING = torchrec_check.torchrec_missing()
REQUIRED = os.environ.get("COURSE_REQUIRE_TORCHREC") == "1"

if MISSING is not None:
    if REQUIRED:
        raise RuntimeError(f"COURSE_REQUIRE_TORCHREC=1 but torchrec does not import: {MISSING}")
    pytest.skip(f"torchrec does not import here ({MISSING})", allow_module_level=True)


@pytest.fixture(scope="module")
def results():
    return {
        r["kind"]: r for r in torchrec_check.run(("table_wise", "column_wise", "row_wise", "data_parallel"))
    }


@pytest.mark.parametrize("kind", ["table_wise", "column_wise"])
def test_torchrec_equals_embedding_bag_and_the_course(results, kind):
    r = results[kind]
    assert r["vs_embedding_bag"] == 0.0, r  # the same rows summed in the same order
    assert r["vs_course"] == 0.0, r
    # the planner cut the tables as the course cuts them (column_wise: DIM / W columns each);
    # table-wise placement may differ (each places by its own cost model)
    if kind == "column_wise":
        assert r["torchrec_plan"] == r["course_plan"]
    else:
        assert len(r["torchrec_plan"]) == len(r["course_plan"]) == len(torchrec_check.CARDS)


def test_data_parallel_equals_embedding_bag(results):
    assert results["data_parallel"]["vs_embedding_bag"] == 0.0


def test_row_wise_is_refused_on_cpu(results):
    # EmbeddingBagCollectionSharder.sharding_types adds row_wise only for compute device "cuda" (or mtia)
    assert "No available sharding type" in results["row_wise"]["refused"]


def test_the_comparison_can_fail():
    """A lookup on wrong ids differs: the comparison above is not vacuous."""
    import torch

    from course_utils import sharding

    g = torch.Generator().manual_seed(0)
    tables = [torch.randn(n, torchrec_check.DIM, generator=g) for n in torchrec_check.CARDS]
    ids = torch.stack([torch.randint(0, n, (4, 2), generator=g) for n in torchrec_check.CARDS], 1)
    assert (
        sharding.lookup_unsharded(tables, ids) - sharding.lookup_unsharded(tables, ids.flip(0))
    ).abs().max() > 0
