"""Two GPUs: NCCL ranks on distinct GPUs, and each technique of the course on them, checked as on CPU.

Most run the CPU tests themselves (``run_cpu_tests``, tests/helpers/); ``launch`` picks NCCL
here because every rank gets a GPU, so these runs exercise the NCCL and CUDA paths of the same code.
"""

import pytest
import torch
import torch.distributed as dist
from helpers.cpu_tests import run_cpu_tests
from helpers.fresh_python import fresh_python
from torch import nn

from course_utils import devices, launch

pytestmark = [pytest.mark.chapter(), pytest.mark.gpu(2)]


def _who():
    from course_utils.runtime.hardware import rank_device

    return dist.get_backend(), str(rank_device()), torch.cuda.current_device()


@pytest.mark.launches
def test_nccl_ranks_on_distinct_gpus():
    assert launch(_who, world_size=2) == [
        ("cpu:gloo,cuda:nccl", "cuda:0", 0),
        ("cpu:gloo,cuda:nccl", "cuda:1", 1),
    ]


def _ring_on_cuda(sizes):
    from course_utils.collectives import ring_all_reduce
    from course_utils.runtime.hardware import rank_device

    worst = 0.0
    for numel in sizes:
        g = torch.Generator().manual_seed(numel + dist.get_rank())
        mine = torch.randn(numel, generator=g).to(rank_device())
        expected, ours = mine.clone(), mine.clone()
        dist.all_reduce(expected)
        ring_all_reduce(ours)
        worst = max(worst, (ours - expected).abs().max().item())
    return worst


@pytest.mark.launches
def test_ring_equals_all_reduce_from_1_kb_to_64_mb():
    sizes = [256 << k for k in range(0, 17, 2)]  # 1 KB .. 64 MB of float32
    assert max(launch(_ring_on_cuda, sizes, world_size=2, timeout=300)) < 1e-5


def _every_ddp_kind(logs, config, settings):
    """On each rank: one run per DDP kind (naive, bucketed, torch), as tests/test_ddp.py runs them."""
    from course_utils.ddp import DDP_KINDS, ddp_worker

    return {kind: ddp_worker(kind, logs, config, settings) for kind in DDP_KINDS}


@pytest.mark.launches
def test_ddp_naive_bucketed_and_torch_agree_with_one_process():
    from course_utils.ddp import DDP_KINDS, TrainSettings, max_difference, train_single
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig

    cards = [3, 16, 100, 400, 1000]  # tests/test_ddp.py's model and settings
    config = DLRMConfig(cards, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))
    sgd = TrainSettings(global_batch_size=512, max_steps=12, optimizer="sgd", lr=0.1)
    logs = data.make_click_logs(8192, seed=0, cardinalities=cards, n_dense=4)
    per_rank = launch(_every_ddp_kind, logs, config, sgd, world_size=2, timeout=300)
    single = train_single(logs, config, sgd, world_size=2)
    for kind in DDP_KINDS:
        assert max_difference(per_rank[0][kind].state, single.state) < 1e-5, kind


@pytest.mark.launches
def test_data_parallel_by_hand_equals_one_gpu():
    run_cpu_tests("tests/test_data_parallel.py::test_by_hand_equals_nn_data_parallel_on_two_gpus")


def test_model_parallel_split_equals_the_whole_model():
    from course_utils.model_parallel import VerticalSplit

    devs = devices(2)
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    split_copy = nn.Sequential(*[m for m in __import__("copy").deepcopy(whole)])
    whole = whole.to(devs[0])
    x, y = torch.randn(32, 64, device=devs[0]), torch.randn(32, 8, device=devs[0])
    nn.functional.mse_loss(whole(x), y).backward()
    split = VerticalSplit(split_copy, devs)
    out = split(x)
    torch.testing.assert_close(out.to(devs[0]), whole(x))
    nn.functional.mse_loss(out.to(devs[0]), y).backward()
    for p, q in zip(nn.Sequential(*split.parts).parameters(), whole.parameters(), strict=False):
        torch.testing.assert_close(p.grad.to(devs[0]), q.grad)


@pytest.mark.launches
def test_1f1b_executor_at_width_2048_finishes_with_equal_gradients():
    from course_utils.pipeline import MLPConfig, one_f_one_b, reference_step, run_schedule

    config = MLPConfig(width=2048, layers=4, batch=64, seed=3)
    run = run_schedule(one_f_one_b(2, 4), config, steps=1, warmup=0, timeout=300)
    ref_loss, ref_grads = reference_step(config)
    assert abs(run.loss - ref_loss) < 1e-4
    for name, g in ref_grads.items():
        torch.testing.assert_close(run.grads[name], g, atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.launches
def test_torch_pipelining_on_two_gpus():
    run_cpu_tests("tests/test_pipeline_executor.py::test_torch_pipelining_agrees_with_the_executor[1F1B]")


@pytest.mark.launches
@pytest.mark.parametrize("case", ["table", "column", "row-range", "row-hash"])
def test_sharding_on_two_gpus(case):
    run_cpu_tests(
        f"tests/test_sharding.py::test_sharded_lookup_equals_unsharded_and_bytes_match_formula[{case}-2]"
    )


@pytest.mark.launches
def test_hybrid_on_two_gpus():
    run_cpu_tests(
        "tests/test_hybrid.py::test_hybrid_training_equals_single_process[table_wise-2]",
        "tests/test_hybrid.py::test_hybrid_training_equals_single_process[column_wise-2]",
    )


@pytest.mark.launches
def test_a_cuda_tensor_sent_to_spawned_ranks_lands_on_each_rank_own_gpu():
    lines = fresh_python("""
    import torch
    from course_utils import launch
    from course_utils.runtime.hardware import rank_device
    x = torch.ones(2, device="cuda")          # on cuda:0; CUDA is initialised, so ranks spawn
    print(launch(lambda t: (str(t.device), str(rank_device())), x, world_size=2, show_output=False))
    """)
    assert lines == ["[('cuda:0', 'cuda:0'), ('cuda:1', 'cuda:1')]"]


def _used_its_gpu(fn, *args):
    """Run ``fn(*args)`` in this rank; return whether it put tensors on this rank's GPU."""
    from course_utils.runtime.hardware import rank_device

    fn(*args)
    return torch.cuda.max_memory_allocated(rank_device()) > 0


@pytest.mark.launches
def test_plain_1f1b_and_pipeline_dp_on_two_gpus():
    from course_utils.pipeline import MLPConfig
    from course_utils.pipeline.pipeline_dp import pipeline_dp_rank
    from course_utils.pipeline.plain import exchange_ms

    config = MLPConfig(width=32, layers=4, batch=32, seed=3)  # tests/test_pipeline_plain.py's
    assert launch(_used_its_gpu, pipeline_dp_rank, config, 2, 1, 4, 1, 0.1, world_size=2) == [True] * 2
    assert launch(_used_its_gpu, exchange_ms, torch.zeros(16, 16), 3, world_size=2) == [True] * 2
    run_cpu_tests(
        "tests/test_pipeline_plain.py::test_plain_1f1b_trains_like_one_process[2-2]",
        "tests/test_pipeline_plain.py::test_plain_1f1b_on_two_ranks_equals_the_executor[4]",
        "tests/test_pipeline_plain.py::test_exchange_ms_times_one_message_each_way",
    )


@pytest.mark.launches
def test_ddp_options_on_two_gpus():
    from course_utils.ddp import options

    assert launch(_used_its_gpu, options.train_with_unused_head, True, world_size=2) == [True] * 2
    assert launch(_used_its_gpu, options.running_means, True, world_size=2) == [True] * 2
    run_cpu_tests(
        "tests/test_ddp_options.py::test_an_unused_parameter_stops_torch_ddp_unless_it_looks_for_unused_parameters",
        "tests/test_ddp_options.py::test_buffers_are_rank_0s_with_broadcast_and_each_rank_own_without",
    )


@pytest.mark.launches
def test_big_table_training_and_async_checkpoints_on_two_gpus(tmp_path):
    from functools import partial

    from course_utils.checkpoint.background import train_big_table

    small = dict(rows=1000, dim=8, global_batch=64, samples=512)  # tests/test_checkpoint_async.py's
    run = partial(train_big_table, str(tmp_path / "used"), steps=2, **small)
    assert launch(_used_its_gpu, run, world_size=2, timeout=300) == [True] * 2
    run_cpu_tests(
        "tests/test_checkpoint_async.py::test_two_ranks_train_the_weights_one_process_trains",
        "tests/test_checkpoint_async.py::test_resume_from_an_async_checkpoint_is_bit_identical",
    )


@pytest.mark.launches
def test_dcp_round_trip_on_cuda():
    run_cpu_tests(
        "tests/test_checkpoint.py::test_sharded_dcp_resume_is_bit_identical_2_ranks[table_wise]",
        "tests/test_checkpoint.py::test_sharded_dcp_resume_is_bit_identical_2_ranks[column_wise]",
    )


@pytest.mark.launches
def test_two_local_nodes_get_distinct_gpus_and_nccl():
    from course_utils.runtime import runner

    run = runner.run_torchrun(
        module="course_utils.scripts.train_ddp", nproc_per_node=1, nnodes=2, rendezvous="c10d", timeout=300
    )
    assert [r["backend"] for r in run.reports] == ["cpu:gloo,cuda:nccl"] * 2
    assert run.reports[0]["fingerprint"] == run.reports[1]["fingerprint"]


def test_cuda_n_split_equals_one_gpu():
    """The chapter's ``.cuda(0)`` / ``.cuda(1)`` split (``TwoGPUSplit``): same loss and gradients
    as the whole model on one GPU, each gradient on its parameter's GPU."""
    from course_utils.model_parallel import TwoGPUSplit

    def make(seed=0):
        torch.manual_seed(seed)
        return nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)])

    torch.manual_seed(1)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    whole = make().cuda(0)
    loss_whole = nn.functional.mse_loss(whole(x.cuda(0)), y.cuda(0))
    loss_whole.backward()
    split = TwoGPUSplit(make(), 0, 1)
    assert {p.device for p in split.part0.parameters()} == {torch.device("cuda", 0)}
    assert {p.device for p in split.part1.parameters()} == {torch.device("cuda", 1)}
    out = split(x)
    assert out.device == torch.device("cuda", 1)
    loss_split = nn.functional.mse_loss(out, y.to(out.device))
    loss_split.backward()
    assert abs(loss_split.item() - loss_whole.item()) < 1e-5
    for p, q in zip(nn.Sequential(split.part0, split.part1).parameters(), whole.parameters(), strict=True):
        assert p.grad.device == p.device
        torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), atol=1e-5, rtol=1e-5)
