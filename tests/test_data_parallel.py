"""DataParallel by hand (course_utils.data_parallel) against single-device training and nn.DataParallel."""

import pytest
import torch
from helpers.training import train_sgd
from torch import nn

from course_utils import gpu_count
from course_utils.collectives import bytes_sent_per_rank
from course_utils.data_parallel import (
    DataParallelByHand,
    ModelWithLoss,
    chunk_sizes,
    gather,
    parallel_apply,
    replicate,
    scatter,
)
from course_utils.data_parallel.traffic import SCHEMES, bytes_sent_per_step
from course_utils.ddp import TrainSettings, max_difference, train_single
from course_utils.workload import data
from course_utils.workload.models import DLRM, DLRMConfig

pytestmark = pytest.mark.chapter(3)

CARDS = [3, 16, 100, 400]
CPU2 = [torch.device("cpu")] * 2


@pytest.fixture(scope="module")
def logs():
    return data.make_click_logs(4096, seed=0, cardinalities=CARDS, n_dense=4)


def small_dlrm(seed=0):
    return DLRM(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,), seed=seed)


def bce(logits, label):
    return nn.functional.binary_cross_entropy_with_logits(logits, label)


def test_chunk_sizes_follow_torch_chunk_like_nn_data_parallel():
    assert chunk_sizes(1024, 2) == [512, 512]
    assert chunk_sizes(10, 4) == [3, 3, 3, 1]
    assert chunk_sizes(5, 4) == [2, 2, 1]  # fewer chunks than devices: one device idles
    with pytest.raises(ValueError, match="batch_size >= 1"):
        chunk_sizes(0, 2)


def test_scatter_splits_rows_in_order_and_checks_shapes():
    x, y = torch.arange(10).reshape(5, 2), torch.arange(5)
    parts = scatter((x, y), [torch.device("cpu")] * 4)
    assert [p[0].shape[0] for p in parts] == [2, 2, 1]
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    with pytest.raises(ValueError, match="same number of rows"):
        scatter((x, torch.arange(4)), CPU2)


def test_replicas_hold_copies_and_backward_sums_their_gradients_onto_the_original():
    model = nn.Linear(3, 2)
    replicas = replicate(model, CPU2)
    assert len(replicas) == 2 and all(r is not model for r in replicas)
    for r in replicas:
        assert torch.equal(r.weight, model.weight) and r.weight.data_ptr() != model.weight.data_ptr()
    xs = [torch.ones(1, 3), 2 * torch.ones(1, 3)]
    gather(parallel_apply(replicas, [(x,) for x in xs], CPU2), CPU2[0]).sum().backward()
    assert torch.allclose(model.weight.grad, torch.full((2, 3), 3.0))  # 1 + 2: one replica each
    assert model.weight.grad_fn is None and model.weight.is_leaf


def test_forward_and_gradients_equal_single_device_on_the_same_batch(logs):
    batch = logs[:1000].to_torch()
    single, parallel = small_dlrm(), small_dlrm()
    dp = DataParallelByHand(parallel, CPU2)
    out_single, out_dp = single(batch.dense, batch.sparse), dp(batch.dense, batch.sparse)
    assert torch.allclose(out_single, out_dp, atol=1e-6)  # rows are independent in the forward
    bce(out_single, batch.label).backward()
    bce(out_dp, batch.label).backward()
    for (name, a), b in zip(single.named_parameters(), parallel.parameters(), strict=False):
        # two half-batch sums added vs one full sum: float32 rounding only
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6), name
    assert set(dp.last_timings) == {"scatter", "replicate", "parallel_apply", "gather", "reduce_gradients"}


def test_training_with_data_parallel_equals_single_device_training(logs):
    cfg = DLRMConfig(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))
    settings = TrainSettings(global_batch_size=256, max_steps=8, optimizer="sgd", lr=0.1)
    ref = train_single(logs, cfg, settings, device=CPU2[0])  # the devices DataParallel runs on
    dp = train_single(logs, cfg, settings, parallel=lambda m: DataParallelByHand(m, CPU2))
    assert max_difference(ref.state, dp.state) < 1e-6
    assert ref.step_loss == pytest.approx(dp.step_loss, abs=1e-6)


def test_a_batch_smaller_than_the_device_list_uses_fewer_replicas():
    model = nn.Linear(3, 1)
    out = DataParallelByHand(model, [torch.device("cpu")] * 4)(torch.ones(2, 3))
    assert out.shape == (2, 1)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="at least one device"):
        DataParallelByHand(nn.Linear(2, 2), [])
    with pytest.raises(ValueError, match=r"must be on devices\[0\].*module.to"):
        DataParallelByHand(nn.Linear(2, 2).to("meta"), CPU2)

    class Broken(nn.Module):
        def forward(self, x):
            raise KeyError("bad feature")

    with pytest.raises(RuntimeError, match="replica 0 on cpu failed: KeyError"):
        DataParallelByHand(Broken(), CPU2)(torch.ones(4, 2))


@pytest.mark.skipif(gpu_count() > 0, reason="the CPU twin of tests/gpu/test_data_parallel_gpus.py")
def test_nn_data_parallel_without_gpus_trains_the_module_itself(logs):
    """Chapter 03's usage cell on a machine without GPUs: the same weights as the plain model."""
    plain, inner = small_dlrm(), small_dlrm()
    wrapped = nn.DataParallel(inner)
    assert wrapped.device_ids == [] and wrapped.module is inner
    assert train_sgd(wrapped, logs, steps=5, batch_size=256) == train_sgd(
        plain, logs, steps=5, batch_size=256
    )
    assert max_difference(plain.state_dict(), inner.state_dict()) == 0


def test_by_hand_trains_as_one_device_with_the_chapters_loop(logs):
    """The CPU twin of the GPU test: DataParallelByHand over two CPU stand-ins, chapter 03's loop."""
    one, two = small_dlrm(), DataParallelByHand(small_dlrm(), CPU2)
    assert train_sgd(two, logs, steps=8, batch_size=256) == pytest.approx(
        train_sgd(one, logs, steps=8, batch_size=256), abs=1e-6
    )
    assert max_difference(one.state_dict(), two.module.state_dict()) < 1e-6


def test_nn_data_parallel_on_cpu_only_calls_the_module():
    model = nn.Linear(3, 2)
    wrapped = nn.DataParallel(model)
    if gpu_count() == 0:
        assert wrapped.device_ids == []
    x = torch.randn(4, 3)
    assert torch.equal(wrapped.cpu()(x) if gpu_count() == 0 else model(x), model(x))


@pytest.mark.skipif(gpu_count() < 2, reason="nn.DataParallel splits work only over 2+ CUDA GPUs")
def test_by_hand_equals_nn_data_parallel_on_two_gpus(logs):
    gpus = [torch.device("cuda", 0), torch.device("cuda", 1)]
    batch = [t.to(gpus[0]) for t in logs[:1000].to_torch()]
    ours, theirs = small_dlrm().to(gpus[0]), small_dlrm().to(gpus[0])
    bce(DataParallelByHand(ours, gpus)(batch[0], batch[1]), batch[2]).backward()
    bce(nn.DataParallel(theirs, device_ids=[0, 1])(batch[0], batch[1]), batch[2]).backward()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=False):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)


def test_single_process_twin_runs_where_the_ranks_would(monkeypatch, logs):
    """train_single's default device is rank 0's of world_size ranks; a parallel wrapper places the model."""
    from course_utils.ddp import train as ddp_train

    cfg = DLRMConfig(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))
    settings = TrainSettings(global_batch_size=256, max_steps=1, optimizer="sgd", lr=0.1)
    asked = []
    monkeypatch.setattr(
        ddp_train, "devices", lambda n, quiet=False: asked.append(n) or [torch.device("cpu")] * n
    )
    train_single(logs, cfg, settings, world_size=2)
    train_single(logs, cfg, settings, parallel=lambda m: DataParallelByHand(m, CPU2))
    assert asked == [2]  # the wrapper chose, so devices() was not asked


def test_bytes_sent_per_step_same_total_different_senders():
    param_bytes = 4 * 1200
    for w in (2, 3, 4, 8):
        sent = {scheme: bytes_sent_per_step(param_bytes, w, scheme) for scheme in SCHEMES}
        for scheme, per_device in sent.items():
            assert len(per_device) == w and sum(per_device) == 2 * (w - 1) * param_bytes, scheme
        assert sent["ring"] == [bytes_sent_per_rank(param_bytes // 4, 4, w, rank=r) for r in range(w)]
        assert sent["copies"][0] == (w - 1) * param_bytes  # device 0 sends every replica's weights
        assert max(sent["nccl"]) <= 2 * param_bytes  # a chain: each device forwards at most twice
    assert bytes_sent_per_step(100, 1, "nccl") == [0]
    with pytest.raises(ValueError, match="scheme must be one of"):
        bytes_sent_per_step(100, 2, "tree")


def test_replica_zero_is_a_copy_unlike_torch_which_shares_device_zero_originals():
    model = nn.BatchNorm1d(3)
    replicas = replicate(model, CPU2)
    assert replicas[0].weight.data_ptr() != model.weight.data_ptr()
    assert replicas[0].running_mean.data_ptr() != model.running_mean.data_ptr()
    replicas[0](torch.randn(8, 3))  # training mode: updates the replica's running statistics only
    assert torch.equal(model.running_mean, torch.zeros(3))


def test_a_model_returning_its_loss_gives_one_loss_per_replica(logs):
    batch = logs[:1000].to_torch()
    single, parallel = ModelWithLoss(small_dlrm()), ModelWithLoss(small_dlrm())
    loss_single = single(batch.dense, batch.sparse, batch.label)
    losses = DataParallelByHand(parallel, CPU2)(batch.dense, batch.sparse, batch.label)
    assert loss_single.dim() == 0 and losses.shape == (2,)
    assert torch.allclose(losses.mean(), loss_single, atol=1e-6)  # equal chunks: mean of means
    loss_single.backward()
    losses.mean().backward()
    for a, b in zip(single.parameters(), parallel.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)
    uneven = DataParallelByHand(ModelWithLoss(small_dlrm()), [torch.device("cpu")] * 3)
    assert uneven(batch.dense, batch.sparse, batch.label).shape == (3,)  # 334, 334, 332 rows
