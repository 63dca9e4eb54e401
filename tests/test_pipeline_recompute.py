"""Activation recomputation on one stage: the saved bytes follow the formulas, the gradients do
not change, and the forward runs twice per micro-batch."""

import pytest
import torch

from course_utils.pipeline import MLPConfig
from course_utils.pipeline.recompute import SavedActivations, measure_recompute, stage_step

pytestmark = pytest.mark.chapter(6)


@pytest.mark.parametrize(("layers", "m"), [(2, 2), (4, 4), (4, 8)])
def test_saved_bytes_follow_the_formulas(layers, m):
    run = measure_recompute(MLPConfig(width=16, layers=layers, batch=8 * m), m=m, repeats=1)
    assert run.boundary_bytes == 8 * 16 * 4
    for recompute in (False, True):
        assert run.peak_bytes[recompute] == run.memory_formula(recompute)
    assert run.peak_bytes[True] < run.peak_bytes[False]
    assert 1 < run.time_formula() < 2


def test_recomputation_gives_the_same_gradients_and_runs_each_forward_twice():
    config = MLPConfig(width=16, layers=4, batch=32)
    xs = config.microbatches(4)[0]
    grads = [torch.randn_like(x) for x in xs]
    results = {}
    for recompute in (False, True):
        stage, calls = config.build(), []
        stage[0].register_forward_hook(lambda *_, calls=calls: calls.append(1))
        stage_step(stage, xs, grads, recompute)
        results[recompute] = ({n: p.grad for n, p in stage.named_parameters()}, len(calls))
    for name, g in results[False][0].items():
        torch.testing.assert_close(results[True][0][name], g)
    assert results[False][1] == 4 and results[True][1] == 8


def test_counter_sees_shared_storage_once_and_frees_it():
    x = torch.randn(10, 10, requires_grad=True)
    with SavedActivations() as saved:
        y = (x * x).sum()  # saves x twice: one storage
        assert saved.live == 400
        y.backward()
    assert saved.peak == 400 and saved.live == 0
