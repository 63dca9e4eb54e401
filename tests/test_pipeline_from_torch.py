"""Torch's zero-bubble and DualPipeV schedules read into the course's Schedule: valid, placed as
torch places them, and simulated: ZB-V idles less than ZB-H1 with the same peak (in
stage-equivalents). And torch's front end: a model cut by pipeline() at SplitPoints, or built on the
meta device, run by torch's schedules, gives one process's gradients (scale_grads=False: m times)."""

import pytest
import torch

from course_utils.pipeline import (
    Costs,
    MLPConfig,
    check_lowered,
    lower,
    simulate,
    steady_state,
    zero_bubble_h1,
)
from course_utils.pipeline.from_torch import from_torch, torch_order
from course_utils.pipeline.torch_frontend import Tower, run_frontend, stage_on_meta, tower_reference

pytestmark = pytest.mark.chapter(6)


@pytest.mark.parametrize(
    "name", ["ScheduleZBVZeroBubble", "ScheduleInterleavedZeroBubble", "ScheduleDualPipeV"]
)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 6), (2, 8)])
def test_torch_schedules_are_valid_and_finish(name, p, m):
    s = from_torch(name, p, m)  # validated inside
    assert s.split_backward and s.num_stages == 2 * p
    assert sum(len(actions) for actions in s.devices) == 3 * m * 2 * p  # F, B, W of every stage
    assert check_lowered(lower(s)) == []


def test_zbv_places_stages_in_a_v():
    s = from_torch("ScheduleZBVZeroBubble", 4, 8)
    assert [s.device_of(n) for n in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert {a.stage for a in s.devices[0]} == {0, 7}
    assert s.name == "ZB-V (torch)"


def test_zbv_beats_zb_h1_at_the_same_peak_memory():
    costs = Costs(F=1, B=1, W=1)
    zbv = simulate(from_torch("ScheduleZBVZeroBubble", 4, 8), costs.per_chunk(2))
    zbh1 = simulate(zero_bubble_h1(4, 8), costs)
    assert zbv.bubble_fraction < 0.6 * zbh1.bubble_fraction
    assert [c / 2 for c in zbv.peak_activations()] == zbh1.peak_activations() == [4, 4, 4, 4]


def test_dualpipev_overlaps_a_forward_with_a_full_backward_and_gains_nothing_in_compute_alone():
    order = torch_order("ScheduleDualPipeV", 4, 8, rank=0)
    pairs = [a for a in order if a.startswith("[")]
    assert pairs and all(a.startswith("[F(") and " | B+W(" in a for a in pairs)
    assert "B+W(7,4)" in order and "B(0,4)" in order  # full backwards, and split ones at the end
    c = Costs(1, 1, 1).per_chunk(2)
    dual, zbv = (from_torch(n, 4, 8) for n in ("ScheduleDualPipeV", "ScheduleZBVZeroBubble"))
    assert [zbv.device_of(n) for n in range(8)] == [dual.device_of(n) for n in range(8)]
    assert simulate(dual, c).bubble_fraction >= simulate(zbv, c).bubble_fraction
    assert steady_state(dual, c).bubble_fraction > steady_state(zbv, c).bubble_fraction == 0


def test_a_stage_built_on_meta_has_the_whole_models_weights():
    config = MLPConfig(width=16, layers=4, batch=8)
    whole = Tower(16, 4).init_weights(config.seed).state_dict()
    part = stage_on_meta(config, 1, 2, torch.device("cpu"))
    assert list(part.blocks) == ["2", "3"]
    assert all(torch.equal(t, whole[k]) for k, t in part.state_dict().items())


@pytest.mark.launches
def test_torch_front_end_gives_one_process_gradients():
    """pipeline() + SplitPoint run by Schedule1F1B, and meta-built stages run by the interleaved
    zero-bubble schedule: the loss and every gradient of one process within 1e-5; with
    scale_grads=False, m times them (the sum of the micro-batches' mean-loss gradients)."""
    config, m = MLPConfig(width=32, layers=4, batch=16), 4
    ref_loss, ref = tower_reference(config)
    runs = run_frontend(config, m, timeout=120)
    for name, factor in (("traced", 1), ("meta, interleaved ZB", 1), ("traced, scale_grads=False", m)):
        losses, grads = runs[name]
        assert sorted(grads) == sorted(ref), name
        assert len(losses) == m and abs(sum(losses) / m - ref_loss) < 1e-6, name
        assert max((grads[k] - factor * g).abs().max().item() for k, g in ref.items()) < 1e-5, name


def test_bad_requests_say_what_is_wrong():
    with pytest.raises(ValueError, match="unknown class 'Schedule1F1B'"):
        from_torch("Schedule1F1B", 2, 4)
    with pytest.raises(ValueError, match="exactly 2 stages per device, got v=3"):
        from_torch("ScheduleZBVZeroBubble", 2, 4, v=3)
    with pytest.raises(ValueError, match=r"needs m >= 2p .* got m=4, p=4"):
        from_torch("ScheduleDualPipeV", 4, 4)
    with pytest.raises(ValueError, match="divisible by 4"):
        run_frontend(MLPConfig(layers=6), 2)
