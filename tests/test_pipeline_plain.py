"""The plain 1F1B loop (sends and receives in line) and pipeline + data parallel, on real
processes (gloo): the same gradients as the course's executor, the same parameters as one
process training the whole model on the whole batch."""

import pytest
import torch
from helpers.p2p import only_batched_p2p

from course_utils import launch
from course_utils.pipeline import MLPConfig, one_f_one_b, run_schedule
from course_utils.pipeline.pipeline_dp import pipeline_dp_rank, run_pipeline_training, train_one_process
from course_utils.pipeline.plain import exchange_ms

pytestmark = [pytest.mark.chapter(6), pytest.mark.launches]

CONFIG = MLPConfig(width=32, layers=4, batch=32, seed=3)
TIMEOUT = 60  # seconds; a deadlock fails the test instead of hanging it


def assert_close(ours: dict, theirs: dict, atol: float) -> None:
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_plain_1f1b_on_two_ranks_equals_the_executor(m):
    plain = run_pipeline_training(CONFIG, stages=2, copies=1, m=m, steps=1, lr=0.1, timeout=TIMEOUT)
    executor = run_schedule(one_f_one_b(2, m), CONFIG, steps=1, warmup=0, timeout=TIMEOUT)
    assert_close(plain["grads"], executor.grads, atol=1e-7)
    # the optimizer step after the flush: SGD's first step is w - lr * grad (momentum starts at 0)
    start = dict(CONFIG.build().named_parameters())
    assert_close(plain["params"], {n: (w - 0.1 * executor.grads[n]).detach() for n, w in start.items()}, 1e-7)
    assert abs(plain["losses"][0] - executor.loss) < 1e-6


@pytest.mark.parametrize(("stages", "m"), [(2, 2), (4, 4), (4, 8)])
def test_plain_1f1b_trains_like_one_process(stages, m):
    ours = run_pipeline_training(CONFIG, stages=stages, copies=1, m=m, steps=3, lr=0.1, timeout=TIMEOUT)
    ref = train_one_process(CONFIG, steps=3, lr=0.1)
    assert_close(ours["params"], ref["params"], atol=1e-6)
    assert ours["losses"] == pytest.approx(ref["losses"], abs=1e-6)


def test_two_pipelines_of_two_stages_train_like_one_process():
    ours = run_pipeline_training(CONFIG, stages=2, copies=2, m=4, steps=5, lr=0.1, timeout=TIMEOUT)
    ref = train_one_process(CONFIG, steps=5, lr=0.1)
    assert_close(ours["grads"], ref["grads"], atol=1e-6)
    assert_close(ours["params"], ref["params"], atol=1e-5)
    assert ours["losses"] == pytest.approx(ref["losses"], abs=1e-6)
    moved = max((ours["params"][n] - w).abs().max().item() for n, w in CONFIG.build().named_parameters())
    assert moved > 1e-3  # the parameters did change: the comparison is not of untouched weights


def test_one_pipeline_on_half_the_batch_does_not_train_like_one_process():
    """Without the other copy's gradients a pipeline learns from its half only: the
    comparison above can tell."""
    half = MLPConfig(width=32, layers=4, batch=16, seed=3)  # the first 16 rows differ from CONFIG's
    ours = run_pipeline_training(half, stages=2, copies=1, m=4, steps=5, lr=0.1, timeout=TIMEOUT)
    ref = train_one_process(CONFIG, steps=5, lr=0.1)
    assert max((ours["params"][n] - w).abs().max().item() for n, w in ref["params"].items()) > 1e-4


def rank_with_only_batched_p2p(*args):
    with only_batched_p2p() as posted:
        result = pipeline_dp_rank(*args)
    return result, [sorted(name for name, _ in b) for b in posted]


def test_every_message_is_posted_with_the_one_it_meets():
    per_rank = launch(
        rank_with_only_batched_p2p, CONFIG, 2, 2, 4, 1, 0.1, world_size=4, timeout=TIMEOUT, show_output=False
    )
    posted = [b for _, batches in per_rank for b in batches]
    assert ["irecv", "isend"] in posted  # steady phase: a send and the receive it meets, together
    assert all(len(b) <= 2 for b in posted)


def test_bad_sizes_fail_before_any_process_starts():
    with pytest.raises(ValueError, match="batch 32 cannot be cut into 2 copies x 5 micro-batches"):
        run_pipeline_training(CONFIG, stages=2, copies=2, m=5)
    with pytest.raises(ValueError, match="4 layers cannot be cut into 3 equal stages"):
        run_pipeline_training(CONFIG, stages=3, copies=1, m=4)


def test_exchange_ms_times_one_message_each_way():
    times = launch(exchange_ms, torch.zeros(16, 16), 3, world_size=2, timeout=TIMEOUT, show_output=False)
    assert len(times) == 2 and all(0 < t < 1000 for t in times)
