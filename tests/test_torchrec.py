"""TorchRec on 2 CPU ranks: its sharded lookups equal F.embedding_bag and the course's; the course's
DLRM trained with DistributedModelParallel (fused Adagrad, TrainPipelineSparseDist) reaches the test
AUC of the course's HybridDLRM; a DCP resume is bit-identical; its gradient division (appendix 07a).

TorchRec is not a course dependency: without it these tests skip, unless
``COURSE_REQUIRE_TORCHREC=1`` (set by ``.ci/run``'s TorchRec part), where a missing or broken
torchrec is a failure.
"""

import os

import pytest
import torch

from course_utils.scripts import torchrec_check

pytestmark = [pytest.mark.chapter(7), pytest.mark.launches]

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


# ---- training beside the course's hybrid DLRM, the pipeline, the resume (appendix 07a) -----------


@pytest.fixture(scope="module")
def logs():
    """Chapter 07's capstone data, as appendix 07a trains on it: 65,536 rows to train, 16,384 to test."""
    from course_utils.workload import data

    clicks = data.make_click_logs(65_536 + 16_384, seed=7, cardinalities=data.criteo_cardinalities(1 / 100))
    return clicks[:65_536], clicks[65_536:]


@pytest.fixture(scope="module")
def comparison(logs):
    from course_utils.sharding import torchrec_train

    return torchrec_train.run_comparison(*logs)  # table-wise, Adagrad lr 0.02, batches of 1,024


def test_torchrec_trains_to_the_hybrid_dlrm_s_auc(comparison):
    theirs, ours = comparison["torchrec"], comparison["hybrid"]
    assert len(theirs["step_loss"]) == len(ours["step_loss"]) == 64
    assert abs(theirs["step_loss"][0] - ours["step_loss"][0]) < 1e-6  # the same start, the same batch
    assert abs(theirs["auc"] - ours["auc"]) < 0.01, (theirs["auc"], ours["auc"])
    assert min(theirs["auc"], ours["auc"]) > 0.68  # both learned (Bayes-optimal: 0.83, chance: 0.5)
    assert max(abs(a - b) for a, b in zip(theirs["step_loss"], ours["step_loss"], strict=True)) < 0.05
    assert len(theirs["plan"]) == 26 and all("table_wise" in line for line in theirs["plan"])


def test_the_pipeline_trains_what_the_plain_loop_trains(logs, comparison):
    from course_utils import launch
    from course_utils.sharding import torchrec_train

    plain = launch(torchrec_train.train_and_test, *logs, {"pipelined": False}, world_size=2, timeout=300)[0]
    assert plain["step_loss"] == comparison["torchrec"]["step_loss"]  # bit for bit
    assert plain["auc"] == comparison["torchrec"]["auc"]


def test_a_dcp_resume_is_bit_identical(logs, tmp_path):
    from course_utils.sharding import torchrec_checkpoint

    train = logs[0][:16_384]
    result = torchrec_checkpoint.run_resume(
        train, tmp_path / "ckpt", steps=16, stop_at=6, optimizer="rowwise_adagrad"
    )
    assert result["identical"] and result["max_difference"] == 0.0 and result["losses_equal"], result
    # 26 tables and their row-wise sums (each on one rank), and on each of the 2 ranks the 10 dense
    # tensors with their Adagrad sums and steps
    assert result["fused_state"] == 26 and result["tensors"] == 26 + 26 + 2 * 10 * 3


def test_a_resume_that_loads_nothing_is_not_identical(logs):
    """The comparison above can fail: the same steps from other weights and no checkpoint differ."""
    from course_utils import launch
    from course_utils.sharding import torchrec_checkpoint

    train, options = logs[0][:8_192], {"optimizer": "rowwise_adagrad"}
    whole = launch(torchrec_checkpoint.resume_run, train, options, 0, 8, world_size=2, show_output=False)
    fresh = launch(torchrec_checkpoint.resume_run, train, options, 3, 8, world_size=2, show_output=False)
    for (_, a), (_, b) in zip(whole, fresh, strict=True):
        assert a.keys() == b.keys()
        assert not all(torch.equal(a[k], b[k]) for k in a)


def test_torchrec_divides_embedding_gradients_by_the_world_size(logs):
    import inspect

    from torchrec.distributed import comm_ops

    from course_utils.sharding import torchrec_train

    assert comm_ops.GRADIENT_DIVISION is True  # the default, in torchrec/distributed/comm_ops.py
    backward = inspect.getsource(comm_ops.All2All_Pooled_Req.backward)
    assert "if GRADIENT_DIVISION:" in backward and "div_(dist.get_world_size" in backward
    ratios = torchrec_train.run_gradient_scale(logs[0][:2_048])  # one SGD step: TorchRec / HybridDLRM
    assert all(abs(r - 1) < 1e-4 for r in ratios[True]), ratios[True]
    assert all(abs(r - 2) < 1e-3 for r in ratios[False]), ratios[False]  # the hook's division, twice


def test_bad_options_get_clear_errors(logs):
    from course_utils.sharding import torchrec_checkpoint, torchrec_dlrm, torchrec_train
    from course_utils.workload.models import DLRM

    with pytest.raises(ValueError, match="unknown option"):
        torchrec_train.run_comparison(*logs, learning_rate=0.1)
    with pytest.raises(ValueError, match="stop_at"):
        torchrec_checkpoint.run_resume(logs[0][:4096], "unused", steps=4, stop_at=4)
    with pytest.raises(ValueError, match="steps of one epoch"):
        torchrec_checkpoint.run_resume(logs[0][:4096], "unused", steps=5, stop_at=2)
    twin = torchrec_dlrm.TorchRecDLRM(DLRM([10, 20], seed=0))
    with pytest.raises(ValueError, match="CUDA only"):
        torchrec_dlrm.plan_tables(twin, None, "row_wise")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        torchrec_dlrm.shard(DLRM([10, 20], seed=0), optimizer="adam")
    with pytest.raises(TypeError, match="course DLRM"):
        torchrec_dlrm.TorchRecDLRM(object())
