"""Torch's zero-bubble schedules read into the course's Schedule: valid, placed as torch places
them, and simulated: ZB-V idles less than ZB-H1 with the same peak (in stage-equivalents)."""

import pytest

from course_utils.pipeline import Costs, check_lowered, lower, simulate, zero_bubble_h1
from course_utils.pipeline.from_torch import from_torch


@pytest.mark.parametrize("name", ["ScheduleZBVZeroBubble", "ScheduleInterleavedZeroBubble"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (3, 6)])
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


def test_bad_requests_say_what_is_wrong():
    with pytest.raises(ValueError, match="unknown class 'Schedule1F1B'"):
        from_torch("Schedule1F1B", 2, 4)
    with pytest.raises(ValueError, match="exactly 2 stages per device, got v=3"):
        from_torch("ScheduleZBVZeroBubble", 2, 4, v=3)
