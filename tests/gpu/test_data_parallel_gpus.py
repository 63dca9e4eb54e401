"""nn.DataParallel on two GPUs (chapter 03): chapter 03's usage loop trains as one GPU does, and
``DataParallelByHand`` gives nn.DataParallel's gradients on the chapter's DLRM.

The CPU twins are in ``tests/test_data_parallel.py``: the same loop (``train_sgd``, tests/helpers/) through
``nn.DataParallel`` on a machine without GPUs, and ``DataParallelByHand`` over CPU stand-ins.
"""

import pytest
import torch
from helpers.training import train_sgd
from torch import nn

from course_utils.data_parallel import DataParallelByHand
from course_utils.ddp import max_difference
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig

pytestmark = [pytest.mark.chapter(), pytest.mark.gpu(2)]


@pytest.fixture(scope="module")
def logs():
    return data.make_click_logs(20_000, seed=0)


def test_nn_data_parallel_trains_as_one_gpu_does(logs):
    config, home = DLRMConfig(logs.cardinalities), torch.device("cuda", 0)
    one, split = config.build(seed=0).to(home), config.build(seed=0).to(home)
    wrapped = nn.DataParallel(split)  # every visible GPU, as chapter 03 writes it
    assert wrapped.device_ids == list(range(torch.cuda.device_count()))
    one_losses, split_losses = train_sgd(one, logs, steps=10), train_sgd(wrapped, logs, steps=10)
    assert max_difference(one.state_dict(), split.state_dict()) < 1e-5
    assert split_losses == pytest.approx(one_losses, abs=1e-5)


def test_by_hand_gives_nn_data_parallels_gradients_on_the_chapters_dlrm(logs):
    config, gpus = DLRMConfig(logs.cardinalities), [torch.device("cuda", 0), torch.device("cuda", 1)]
    batch = [t.to(gpus[0]) for t in logs[:2048].to_torch()]
    ours, theirs = config.build(seed=0).to(gpus[0]), config.build(seed=0).to(gpus[0])
    bce = nn.functional.binary_cross_entropy_with_logits
    bce(DataParallelByHand(ours, gpus)(batch[0], batch[1]), batch[2]).backward()
    bce(nn.DataParallel(theirs, device_ids=gpus)(batch[0], batch[1]), batch[2]).backward()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert ((a.grad - b.grad).abs().max() / b.grad.abs().max()).item() < 1e-5
