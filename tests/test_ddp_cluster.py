"""Chapter 04's timings on the modeled cluster (course_utils.ddp.overlap, runs.scaling, published).

* ``hidden_ns`` on timelines written by hand;
* ``step_profile``: the all-reduces each variant issues, their time equal to the network's formula,
  none hidden for the kinds that send after backward, the same figures run after run (virtual time);
* ``runs.scaling``: one GPU without DDP, then PyTorch's DDP on groups of the launch's ranks;
* ``published``: ResNet-50 at its real size, the compute fraction solved from one point, and the
  benchmark's iteration on meta tensors at 1 and 2 ranks;
* ``step_seconds`` still measures wall time without a cluster (``scripts.gpu_report`` uses it).
"""

from __future__ import annotations

import pytest
import torch

from course_utils import Cluster, launch
from course_utils.ddp import overlap, published, runs
from course_utils.runtime.cluster import ClusterTimeline, Span, collective_seconds
from course_utils.workload.models import DLRMConfig
from course_utils.workload.resnet import RESNET50_PARAMETERS, resnet50

pytestmark = pytest.mark.chapter(4)

TINY = DLRMConfig((3, 5, 7), n_dense=4, embedding_dim=16, bottom_mlp=(32, 16), top_mlp=(64, 32))
T4 = Cluster("t4", "pcie-gen3")
ONE_BUCKET = {"bucket_cap_mb": 64.0, "first_bucket_cap_mb": 64.0}


def test_hidden_ns_counts_the_collectives_time_the_compute_stream_was_busy():
    spans = (
        Span(0, "compute", "backward", 0, 100),
        Span(0, "compute", "optimizer", 150, 200),
        Span(0, "collectives", "all_reduce 1 MB", 50, 120),  # 50 of its 70 ns beside backward
        Span(0, "collectives", "all_reduce 1 MB", 120, 180),  # 30 of 60 beside the optimizer
        Span(1, "collectives", "all_reduce 1 MB", 0, 500),  # another rank's: not counted
    )
    assert overlap.hidden_ns(ClusterTimeline(spans), 0) == (130, 80)
    assert overlap.hidden_ns(ClusterTimeline(spans[:2]), 0) == (0, 0)


def test_dlrm_batch_ids_fit_their_tables():
    dense, sparse, label = overlap.dlrm_batch(TINY, 50, seed=1)
    assert dense.shape == (50, 4) and sparse.shape == (50, 3) and label.shape == (50,)
    assert all(int(sparse[:, t].max()) < n for t, n in enumerate(TINY.cardinalities))
    assert torch.equal(sparse, overlap.dlrm_batch(TINY, 50, seed=1)[1])


@pytest.fixture(scope="module")
def profiled():
    variants = {
        "none": ("none", {}),
        "naive": ("naive", {}),
        "one bucket": ("bucketed", ONE_BUCKET),
        "bucketed": ("bucketed", {"bucket_cap_mb": 0.01, "first_bucket_cap_mb": 0.01}),
        "torch": ("torch", {}),
    }
    first = launch(overlap.step_profile, variants, TINY, 64, world_size=2, cluster=T4, timeout=120)
    again = launch(overlap.step_profile, variants, TINY, 64, world_size=2, cluster=T4, timeout=120)
    return first, again


@pytest.mark.launches
def test_each_variant_issues_its_all_reduces_priced_by_the_network_formula(profiled):
    step = profiled[0][0]
    parameters = [p.numel() * p.element_size() for p in TINY.build().parameters()]
    alpha, beta = T4.network.link([0, 1])
    assert step["none"]["all_reduces"] == 0 and step["none"]["communication_ns"] == 0
    assert step["naive"]["messages"] == parameters and step["naive"]["all_reduces"] == len(parameters)
    assert step["one bucket"]["messages"] == [sum(parameters)] and step["one bucket"]["all_reduces"] == 1
    assert len(step["bucketed"]["messages"]) > 1 and sum(step["bucketed"]["messages"]) == sum(parameters)
    for name in ("naive", "one bucket", "bucketed"):
        sizes = step[name]["messages"]
        by_formula = sum(round(collective_seconds("all_reduce", n, 2, alpha, beta) * 1e9) for n in sizes)
        assert abs(step[name]["communication_ns"] - by_formula) <= len(sizes), name


@pytest.mark.launches
def test_what_is_sent_after_backward_hides_behind_nothing(profiled):
    step = profiled[0][0]
    assert step["naive"]["hidden_ns"] == 0 and step["one bucket"]["hidden_ns"] == 0
    assert step["naive"]["wait_ns"] > 0 and step["one bucket"]["wait_ns"] > 0
    assert step["none"]["step_ns"] < min(step[n]["step_ns"] for n in ("naive", "one bucket", "torch"))
    for name in ("naive", "one bucket", "bucketed", "torch"):
        line = step[name]["timeline"]
        assert line.end_ns - line.start_ns == step[name]["step_ns"], name  # the timed step, cut out


@pytest.mark.launches
def test_the_figures_are_the_same_run_after_run_and_on_both_ranks(profiled):
    first, again = profiled
    keys = ("step_ns", "wait_ns", "all_reduces", "communication_ns", "hidden_ns")
    for name in first[0]:
        assert [first[0][name][k] for k in keys] == [again[0][name][k] for k in keys], name
        assert first[0][name]["step_ns"] == first[1][name]["step_ns"], name


@pytest.mark.launches
def test_step_profile_needs_a_modeled_cluster():
    from course_utils.runtime.launcher import RankFailedError

    with pytest.raises(RankFailedError, match="launch it with cluster="):
        launch(overlap.step_profile, {"none": ("none", {})}, TINY, 8, world_size=1, timeout=60)


@pytest.mark.launches
def test_scaling_times_one_gpu_then_ddp_on_groups_of_the_ranks():
    scaled = launch(
        runs.scaling, (1, 2, 4), TINY, 32, world_size=4, cluster=Cluster("h100", "nvlink"), timeout=180
    )
    assert scaled[1:] == [{}, {}, {}]  # the figures come back from rank 0
    figures = scaled[0]
    assert sorted(figures) == [1, 2, 4]
    assert figures[1]["communication_ns"] == 0 and figures[1]["all_reduces"] == 0
    assert all(figures[w]["all_reduces"] >= 1 for w in (2, 4))
    assert figures[4]["communication_ns"] > figures[2]["communication_ns"]  # a ring pays 2 (w - 1) alpha


def test_resnet50_by_hand_has_torchvisions_size_and_shapes():
    with torch.device("meta"):
        model = resnet50()
        logits = model(torch.empty(2, 3, 224, 224))
    assert sum(p.numel() for p in model.parameters()) == RESNET50_PARAMETERS == 25_557_032
    assert logits.shape == (2, 1000) and len(list(model.parameters())) == 161


def test_calibrate_sets_the_fraction_that_prices_one_gpu_at_the_published_time():
    device, seconds = published.calibrate()
    assert 0 < device.compute_efficiency <= 1
    assert seconds == pytest.approx(published.PUBLISHED["no DDP"], abs=2e-5)
    slower, _ = published.calibrate(2 * published.PUBLISHED["no DDP"])
    assert slower.compute_efficiency < device.compute_efficiency
    with pytest.raises(ValueError, match="even at its full peak"):
        published.calibrate(1e-4)


@pytest.mark.launches
def test_the_benchmark_iteration_on_meta_at_one_and_two_ranks():
    device, seconds = published.calibrate()
    cluster = Cluster(device, published.DGX1)
    ranks = launch(published.iteration_seconds, (1, 2), world_size=2, cluster=cluster, timeout=300)
    assert ranks[1] == {}
    times = ranks[0]["seconds"]
    assert times["no DDP"] == pytest.approx(seconds, abs=2e-6)  # the launched rank prices as calibrate does
    assert times["no DDP"] < times[1] <= times[2]  # DDP's copies, then the all-reduces
    assert sum(ranks[0]["buckets"]) == 4 * RESNET50_PARAMETERS


@pytest.mark.launches
def test_step_seconds_measures_wall_time_without_a_cluster():
    variants = {
        "none": ("none", {}),
        "bucketed": ("bucketed", {"bucket_cap_mb": 0.002, "first_bucket_cap_mb": 0.002}),
    }
    result = launch(overlap.step_seconds, variants, 32, 3, 16, 1, 1, world_size=2, timeout=120)[0]
    assert result["backward"] > 0 and set(result["seconds"]) == set(variants)
    assert len(result["bucket_bytes"]["bucketed"]) > 1 and result["waits"]["bucketed"] >= 0
