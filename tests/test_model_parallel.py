"""Vertical model parallel equals the unsplit model, and its measured step shows one device at a time;
embedding tables placed on devices look up the same rows. (Tensor parallelism: test_tensor_parallel.py.)"""

import pytest
import torch
from torch import nn

from course_utils import devices, launch
from course_utils.model_parallel import (
    VerticalSplit,
    ddp_split_gradients,
    lookup_placed,
    partition_sequential,
    place_embedding_tables,
)
from course_utils.pipeline.vertical import as_timeline, split_step
from course_utils.runtime.cluster import Cluster, ClusterTimeline

pytestmark = pytest.mark.chapter(5)

TIMEOUT = 60


def make_model(layers=6, width=16, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])


def test_partition_keeps_names_and_sizes():
    model = make_model()
    parts = partition_sequential(model, [1, 2, 3])
    assert [len(p) for p in parts] == [1, 2, 3]
    assert [n for n, _ in parts[1].named_parameters()] == ["1.0.weight", "1.0.bias", "2.0.weight", "2.0.bias"]
    assert parts[2][0] is model[3]  # shared, not copied
    assert [len(p) for p in partition_sequential(model, 3)] == [2, 2, 2]


@pytest.mark.parametrize(
    "parts,match",
    [
        (4, "cannot cut 6 layers into 4 equal parts"),
        ([2, 2], r"part sizes \[2, 2\] must be positive and add up to the model's 6"),
        ([0, 6], "must be positive"),
    ],
)
def test_partition_errors_say_what_to_do(parts, match):
    with pytest.raises(ValueError, match=match):
        partition_sequential(make_model(), parts)
    with pytest.raises(TypeError, match="needs an nn.Sequential, got Linear"):
        partition_sequential(nn.Linear(2, 2), 2)


@pytest.mark.parametrize("n_devices", [2, 3])
def test_vertical_split_equals_the_unsplit_model(n_devices):
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    ref = make_model()
    nn.functional.mse_loss(ref(x), y).backward()
    split = VerticalSplit(make_model(), devices(n_devices, quiet=True))
    out = split(x)
    torch.testing.assert_close(out, ref(x))
    nn.functional.mse_loss(out, y).backward()
    for (name, p), (_, q) in zip(
        nn.Sequential(*split.parts).named_parameters(), ref.named_parameters(), strict=False
    ):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_memory_per_device_adds_up():
    split = VerticalSplit(make_model(layers=4, width=16), devices(2, quiet=True), sizes=[1, 3])
    table = split.memory_per_device(torch.randn(10, 16))
    assert table["parameters"].tolist() == [16 * 16 + 16, 3 * (16 * 16 + 16)]
    assert table["weights_MB"].tolist() == pytest.approx([272 * 4 / 1e6, 816 * 4 / 1e6])
    assert table["optimizer_MB"].tolist() == pytest.approx([2 * w for w in table["weights_MB"]])
    # what autograd saves: each part's input (its first Linear keeps it) and every ReLU's output
    # (the next Linear's input: the same tensor); the Linear outputs only feed a ReLU, which keeps
    # its own output instead
    assert table["activations_MB"].tolist() == pytest.approx([2 * 10 * 16 * 4 / 1e6, 4 * 10 * 16 * 4 / 1e6])


@pytest.mark.launches
def test_split_step_on_two_modeled_gpus_takes_turns_and_pays_each_hop():
    model, t4 = make_model(layers=4, width=64), Cluster("t4", "pcie-gen3")
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    whole = launch(split_step, model, x, y, world_size=1, cluster=t4, timeout=TIMEOUT, show_output=False)
    split = launch(split_step, model, x, y, world_size=2, cluster=t4, timeout=TIMEOUT, show_output=False)
    t = as_timeline(split)
    order = sorted(t.events, key=lambda e: e.start)
    assert [str(e.action) for e in order] == ["F(0,0)", "F(1,0)", "B(1,0)", "B(0,0)"]
    assert all(a.end <= b.start for a, b in zip(order, order[1:], strict=False)), "two parts overlapped"
    assert t.peak_activations() == [1, 1] and t.bubble_fraction > 0.5  # each idles while the other works
    # the same work as the whole model on one GPU, plus two hops of a [32, 64] float32 tensor
    alpha, beta = t4.network.link([0, 1])
    hop_ns = round((alpha + 32 * 64 * 4 / beta) * 1e9)
    assert round(t.makespan * 1e6) == round(whole[0]["step_ms"] * 1e6) + 2 * hop_ns
    sends = [
        s for s in ClusterTimeline.merge(r["timeline"] for r in split).spans if s.lane.startswith("send")
    ]
    assert [s.duration_ns for s in sends] == [hop_ns, hop_ns]


@pytest.mark.launches
def test_split_step_runs_without_a_cluster_too():
    results = launch(
        split_step, make_model(layers=6), torch.randn(8, 16), torch.randn(8, 16), [1, 2, 3],
        world_size=3, timeout=TIMEOUT, show_output=False,
    )  # fmt: skip
    t = as_timeline(results)
    assert t.num_devices == 3 and all(r["timeline"] is None for r in results)
    assert [str(e.action) for e in sorted(t.events, key=lambda e: e.start)][:3] == [
        "F(0,0)",
        "F(1,0)",
        "F(2,0)",
    ]


def _ddp_over_splits(model, x, y):
    return ddp_split_gradients(model, x, y, parts_per_rank=2)


@pytest.mark.launches
def test_ddp_over_a_split_model_gives_the_one_process_gradients():
    torch.manual_seed(5)
    x, y = torch.randn(12, 16), torch.randn(12, 16)
    ref = make_model(layers=4)
    nn.functional.mse_loss(ref(x), y).backward()
    results = launch(
        _ddp_over_splits, make_model(layers=4), x, y, world_size=2, timeout=TIMEOUT, show_output=False
    )
    for result in results:
        assert result["devices"] == ["cpu"] and result["multi_device"] is False  # CPU stand-ins
        assert list(result["grads"]) == [
            f"parts.{k // 2}.{k}.0.{w}" for k in range(4) for w in ("weight", "bias")
        ]
        for (name, grad), q in zip(result["grads"].items(), ref.parameters(), strict=True):
            torch.testing.assert_close(grad, q.grad, msg=name)


def _ddp_odd_batch():
    return ddp_split_gradients(make_model(layers=2), torch.randn(5, 16), torch.randn(5, 16))


@pytest.mark.launches
def test_ddp_over_a_split_model_names_a_batch_that_does_not_split():
    from course_utils.runtime.launcher import RankFailedError

    with pytest.raises(RankFailedError, match="a batch of 5 rows does not split evenly over 2 ranks"):
        launch(_ddp_odd_batch, world_size=2, timeout=TIMEOUT, show_output=False)


def test_embedding_tables_on_devices_look_up_the_same_rows():
    from course_utils.workload.models import DLRM

    model = DLRM([50, 7, 300, 20], embedding_dim=8)
    sparse = torch.stack([torch.randint(0, c, (16,)) for c in (50, 7, 300, 20)], dim=1)
    expected = model.embed(sparse)
    devs = devices(2, quiet=True)
    assert place_embedding_tables(model, devs, balance=False) == [0, 1, 0, 1]
    assert place_embedding_tables(model, devs) == [1, 1, 0, 1]  # 300 rows alone vs 50 + 7 + 20
    torch.testing.assert_close(lookup_placed(model, sparse, devs[0]), expected)
