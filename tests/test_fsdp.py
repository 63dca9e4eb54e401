"""Sharded data parallelism: fully_shard (FSDP2) on 2 gloo ranks trains an MLP to the parameters one
process reaches, each rank holding (4 + 4 + 8) * N / W bytes plus Adam's unsharded step counters;
the bytes-per-parameter table reproduces the ZeRO paper's figures."""

import pytest
import torch
from torch import nn

from course_utils import launch
from course_utils.model_parallel.fsdp import fsdp_train, train_one_process
from course_utils.model_parallel.training_memory import PRECISIONS, bytes_per_parameter, memory_table

pytestmark = pytest.mark.chapter(5)

TIMEOUT = 120


def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3)], nn.Linear(64, 8))


@pytest.mark.launches
def test_fully_shard_trains_like_one_process_on_a_quarter_of_the_memory_each():
    model = _model()
    torch.manual_seed(1)
    batches = [(torch.randn(16, 64), torch.randn(16, 8)) for _ in range(3)]
    ref = train_one_process(model, batches)
    results = launch(fsdp_train, model, batches, world_size=2, timeout=TIMEOUT, show_output=False)
    n = sum(p.numel() for p in model.parameters())
    moved = max((ref["params"][k] - p).abs().max().item() for k, p in model.named_parameters())
    assert moved > 1e-4  # training changed the parameters, so equality below says something
    for r in results:
        assert r["numel"] == n
        for name, p in ref["params"].items():
            torch.testing.assert_close(r["params"][name], p, atol=1e-5, rtol=0)
        held = r["held"]
        assert held["parameters"] == held["gradients"] == 4 * n // 2
        assert held["optimizer"] == 8 * n // 2
        assert held["not sharded"] == 4 * len(ref["params"])  # one fp32 step counter per parameter
    whole = ref["held"]
    assert whole["parameters"] + whole["gradients"] + whole["optimizer"] == 16 * n


@pytest.mark.launches
def test_fully_shard_refuses_a_batch_that_does_not_split():
    from course_utils import RankFailedError

    with pytest.raises(RankFailedError, match="a batch of 5 rows does not split evenly over 2 ranks"):
        launch(
            fsdp_train,
            _model(),
            [(torch.randn(5, 64), torch.randn(5, 8))],
            world_size=2,
            timeout=TIMEOUT,
            show_output=False,
        )


def test_bytes_per_parameter_by_precision():
    fp32, mixed, mixed_fp32_grads = PRECISIONS
    assert (fp32.total, mixed.total, mixed_fp32_grads.total) == (16, 16, 18)
    assert mixed.optimizer_state == 12  # the ZeRO paper's K for mixed-precision Adam
    assert mixed.total * 1.5e9 == 24e9  # ZeRO section 3.1: at least 24 GB for GPT-2 (1.5B)


def test_zero_stages_reproduce_the_zero_paper_figure_1():
    # 7.5B parameters, 64 data-parallel ranks: 120, 31.4, 16.6 and 1.9 GB per device
    mixed = PRECISIONS[1]
    gb = [round(bytes_per_parameter(mixed, 64, stage) * 7.5e9 / 1e9, 1) for stage in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    assert bytes_per_parameter(PRECISIONS[0], 2, 3) == 8.0  # fp32 under FSDP on 2 ranks: 16 / 2
    table = memory_table(8)
    assert table["total"].tolist() == [16, 16, 18]
    assert table["stage 3, W=8"].tolist() == [2.0, 2.0, 2.25]


@pytest.mark.parametrize("stage,world,match", [(4, 2, "ZeRO stage must be"), (1, 0, "world must be")])
def test_bytes_per_parameter_refuses_what_does_not_exist(stage, world, match):
    with pytest.raises(ValueError, match=match):
        bytes_per_parameter(PRECISIONS[0], world, stage)
