"""DDP by hand (naive, bucketed) against torch DDP and single-process training on the global batch."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils import RankFailedError, launch
from course_utils.ddp import (
    DDP_KINDS,
    BucketedDDP,
    NaiveDDP,
    TrainSettings,
    broadcast_parameters,
    ddp_worker,
    finish_gradient_sync,
    make_buckets,
    max_difference,
    train_single,
    wrap,
)
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig

pytestmark = [
    pytest.mark.chapter(4),
    pytest.mark.launches,
    pytest.mark.usefixtures("no_garbage_before_fork"),  # tests/conftest.py
]

CARDS = [3, 16, 100, 400, 1000]
CONFIG = DLRMConfig(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))
SGD = TrainSettings(global_batch_size=512, max_steps=12, optimizer="sgd", lr=0.1)
ADAM = TrainSettings(global_batch_size=512, max_steps=12, optimizer="adam", lr=3e-3)


@pytest.fixture(scope="module")
def logs():
    return data.make_click_logs(8192, seed=0, cardinalities=CARDS, n_dense=4)


def every_kind(logs, settings):
    """On each rank: one run per DDP kind (naive, bucketed, torch), same data and seeds."""
    return {kind: ddp_worker(kind, logs, CONFIG, settings) for kind in DDP_KINDS}


@pytest.fixture(scope="module")
def runs(logs):
    """{optimizer: (per-rank {kind: result}, single-process result)}: two launches for the module."""
    out = {}
    for name, settings in (("sgd", SGD), ("adam", ADAM)):
        per_rank = launch(every_kind, logs, settings, world_size=2, timeout=120, show_output=False)
        out[name] = per_rank, train_single(logs, CONFIG, settings, world_size=2)
    return out


@pytest.mark.parametrize("optimizer, tolerance", [("sgd", 1e-6), ("adam", 1e-5)])
def test_every_ddp_equals_single_process_training_on_the_global_batch(runs, optimizer, tolerance):
    # float32 sums in another order differ by ~1e-7 relative; 12 steps keep that far below the tolerance
    # (Adam divides by sqrt(v), which magnifies rounding in tiny gradients: hence its looser bound)
    per_rank, single = runs[optimizer]
    for kind in DDP_KINDS:
        assert max_difference(per_rank[0][kind].state, single.state) < tolerance, kind
        assert per_rank[0][kind].step_loss == pytest.approx(single.step_loss, abs=1e-5), kind


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_ranks_stay_identical_and_by_hand_equals_torch_ddp(runs, optimizer):
    per_rank, _ = runs[optimizer]
    for kind in DDP_KINDS:
        assert max_difference(per_rank[0][kind].state, per_rank[1][kind].state) == 0.0, kind
    for kind in ("naive", "bucketed"):
        assert max_difference(per_rank[0][kind].state, per_rank[0]["torch"].state) < 1e-6, kind


def test_collective_counts_naive_one_per_parameter_bucketed_one_per_bucket(runs):
    per_rank, _ = runs["sgd"]
    n_params = len(list(CONFIG.build().parameters()))
    assert per_rank[0]["naive"].collectives == SGD.max_steps * n_params
    assert per_rank[0]["bucketed"].collectives == SGD.max_steps * 1  # this model fits one 1 MiB bucket


def test_broadcast_makes_every_rank_start_from_rank_0():
    def rank_fn():
        model = nn.Linear(4, 3)
        with torch.no_grad():
            model.weight.fill_(dist.get_rank() + 1.0)
        broadcast_parameters(model)
        return model.weight.sum().item()

    assert launch(rank_fn, world_size=2, timeout=60, show_output=False) == [12.0, 12.0]


def accumulate(logs, kind, accumulation):
    settings = TrainSettings(
        global_batch_size=512, max_steps=6, optimizer="sgd", lr=0.1, accumulation_steps=accumulation
    )
    return (
        ddp_worker(kind, logs, CONFIG, settings, bucket_cap_mb=0.01, first_bucket_cap_mb=0.01)
        if kind == "bucketed"
        else ddp_worker(kind, logs, CONFIG, settings)
    )


def test_no_sync_accumulation_equals_one_big_batch_and_skips_communication(logs):
    def rank_fn():
        return {
            (kind, acc): accumulate(logs, kind, acc)
            for kind in ("naive", "bucketed", "torch")
            for acc in (1, 4)
        }

    result = launch(rank_fn, world_size=2, timeout=120, show_output=False)[0]
    for kind in ("naive", "bucketed", "torch"):
        assert max_difference(result[kind, 1].state, result[kind, 4].state) < 1e-6, kind
    for kind in ("naive", "bucketed"):  # 4 micro-batches, but one gradient sync per step
        assert result[kind, 4].collectives == result[kind, 1].collectives, kind
    assert result["bucketed", 1].collectives > 6  # small buckets: several per step


def test_buckets_are_rebuilt_in_gradient_order_like_torch_ddp(logs):
    big = DLRMConfig([20_000, 9_000, 400, 16], n_dense=4, embedding_dim=16, bottom_mlp=(32,), top_mlp=(32,))
    batch = data.make_click_logs(256, seed=1, cardinalities=big.cardinalities, n_dense=4).to_torch()

    def rank_fn():
        layouts = {}
        for kind in ("bucketed", "torch"):
            model = wrap(big.build(seed=0), kind)
            for _ in range(3):  # torch DDP rebuilds its buckets at the start of the 2nd forward
                loss = nn.functional.binary_cross_entropy_with_logits(
                    model(batch.dense, batch.sparse), batch.label
                )
                loss.backward()
                finish_gradient_sync(model)
            layouts[kind] = model
        ours, torch_ddp = layouts["bucketed"], layouts["torch"]
        theirs = torch_ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        return (
            [b.nbytes for b in ours.buckets],
            [int(s) for s in str(theirs).split(",")],
            ours.buckets[-1].names,
        )

    ours, theirs, last_bucket = launch(rank_fn, world_size=2, timeout=120, show_output=False)[0]
    assert ours == theirs and len(ours) > 1
    assert "bottom.0.weight" in last_bucket  # the bottom MLP gets its gradients last in a DLRM


def test_make_buckets_fills_each_bucket_up_to_the_cap():
    params = [(f"p{i}", nn.Parameter(torch.zeros(n))) for i, n in enumerate([100, 200, 300, 400, 50])]
    buckets = make_buckets(params, cap_bytes=1200, first_cap_bytes=400)  # 4 bytes per float32
    assert [b.names for b in buckets] == [["p0"], ["p1", "p2"], ["p3"], ["p4"]]
    assert [b.nbytes for b in buckets] == [400, 2000, 1600, 200]
    assert buckets[1].view(1).shape == (300,) and buckets[1].offsets == [0, 200]


@pytest.mark.parametrize("kind", ["naive", "bucketed"])
def test_a_parameter_without_gradient_gives_a_clear_error(kind):
    def rank_fn():
        model = wrap(nn.ModuleDict({"used": nn.Linear(2, 1), "unused": nn.Linear(2, 1)}), kind)
        model.module["used"](torch.ones(3, 2)).sum().backward()
        finish_gradient_sync(model)

    with pytest.raises(RankFailedError, match="got no gradient"):
        launch(rank_fn, world_size=2, timeout=60, show_output=False)


def test_bad_settings_and_missing_group_are_explained():
    with pytest.raises(RuntimeError, match="initialised process group"):
        NaiveDDP(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="multiple of 6"):
        TrainSettings(global_batch_size=512, accumulation_steps=3).per_rank_batch(2)
    with pytest.raises(ValueError, match="kind must be one of"):
        wrap(nn.Linear(2, 2), "horovod")
    assert issubclass(BucketedDDP, NaiveDDP)
