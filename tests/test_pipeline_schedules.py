"""Schedules as data: every action once, dependencies respected, no deadlock once lowered
to sends and receives, and clear errors for arguments a schedule cannot take."""

import itertools

import pytest

from course_utils.pipeline import (
    SCHEDULE_KINDS,
    Action,
    Schedule,
    ScheduleKind,
    check_lowered,
    gpipe,
    interleaved_1f1b,
    lower,
    one_f_one_b,
    run_in_order,
    validate,
    zero_bubble_h1,
    zero_bubble_h2,
)
from course_utils.pipeline import SCHEDULES as BUILDERS
from course_utils.pipeline.mlp import MLPConfig

pytestmark = pytest.mark.chapter(6)


def all_schedules():
    """Every schedule for p = 1..5, m = 1..12, v = 2..3 whose arguments are allowed."""
    for p, m in itertools.product(range(1, 6), range(1, 13)):
        yield gpipe(p, m)
        if m >= p:
            yield one_f_one_b(p, m)
            yield zero_bubble_h1(p, m)
            if m >= 2 * p - 1:
                yield zero_bubble_h2(p, m)
            if m % p == 0:
                for v in (2, 3):
                    yield interleaved_1f1b(p, m, v)


SCHEDULES = list(all_schedules())


def test_many_schedules_were_generated():
    assert len(SCHEDULES) > 150
    assert {s.name for s in SCHEDULES} == {"GPipe", "1F1B", "ZB-H1", "ZB-H2", "Interleaved 1F1B"}


def test_one_kind_per_schedule_its_value_its_title_and_its_builder():
    made = {
        ScheduleKind.GPIPE: gpipe(2, 2),
        ScheduleKind.ONE_F_ONE_B: one_f_one_b(2, 2),
        ScheduleKind.INTERLEAVED_1F1B: interleaved_1f1b(2, 2, 2),
        ScheduleKind.ZERO_BUBBLE_H1: zero_bubble_h1(2, 2),
        ScheduleKind.ZERO_BUBBLE_H2: zero_bubble_h2(2, 3),
    }
    assert [str(kind) for kind in ScheduleKind] == [
        "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1", "zero_bubble_h2", "zb_v", "interleaved_zb",
        "dualpipe_v",
    ]  # fmt: skip
    assert [kind.title for kind in ScheduleKind] == [
        "GPipe", "1F1B", "Interleaved 1F1B", "ZB-H1", "ZB-H2", "ZB-V (torch)", "Interleaved ZB (torch)",
        "DualPipeV (torch)",
    ]  # fmt: skip
    for kind, schedule in made.items():
        assert schedule.kind is kind and schedule.name == kind.title and kind == kind.value
        assert BUILDERS[kind] is SCHEDULE_KINDS[kind].build and BUILDERS[kind.value] is BUILDERS[kind]
        assert str(schedule).startswith(f"{kind.title}: p=2 devices")
    assert interleaved_1f1b(2, 2, 1).kind is ScheduleKind.ONE_F_ONE_B  # v = 1 is plain 1F1B
    assert Schedule("1f1b", 1, 1, 1, ()).kind is ScheduleKind.ONE_F_ONE_B  # the value is accepted
    with pytest.raises(ValueError, match="'1F1B' is not a valid ScheduleKind"):
        Schedule("1F1B", 1, 1, 1, ())


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.name}-p{s.p}-m{s.m}-v{s.v}")
def test_each_action_exactly_once_on_its_device_and_no_deadlock(schedule):
    kinds = "FBW" if schedule.split_backward else "FB"
    flat = [(d, a) for d, acts in enumerate(schedule.devices) for a in acts]
    assert len(flat) == len({a for _, a in flat}), "an action occurs twice"
    assert {a for _, a in flat} == {
        Action(k, n, j) for k in kinds for n in range(schedule.p * schedule.v) for j in range(schedule.m)
    }
    assert all(a.stage % schedule.p == d for d, a in flat)
    # the dependencies, checked directly on the order of each device and across devices
    assert run_in_order(schedule) == []
    assert validate(schedule) is schedule
    # lowered to receive / compute / send with non-blocking sends: every device finishes
    assert check_lowered(lower(schedule)) == []


@pytest.mark.parametrize("p,m", [(2, 4), (3, 5), (4, 8)])
def test_one_f_one_b_warms_up_with_p_minus_1_minus_d_forwards(p, m):
    s = one_f_one_b(p, m)
    for d, actions in enumerate(s.devices):
        kinds = "".join(a.kind for a in actions)
        warmup = p - 1 - d
        assert kinds == "F" * warmup + "FB" * (m - warmup) + "B" * warmup


def test_gpipe_runs_all_forwards_first():
    s = gpipe(3, 4)
    assert str(s.devices[1][:5]) == "(F(1,0), F(1,1), F(1,2), F(1,3), B(1,0))"


def test_interleaved_places_stage_n_on_device_n_mod_p_and_v1_is_1f1b():
    s = interleaved_1f1b(2, 4, 2)
    assert (
        s.num_stages == 4
        and {a.stage for a in s.devices[0]} == {0, 2}
        and {a.stage for a in s.devices[1]} == {1, 3}
    )
    assert interleaved_1f1b(3, 6, 1) == one_f_one_b(3, 6)


@pytest.mark.parametrize("make", [zero_bubble_h1, zero_bubble_h2])
def test_zero_bubble_w_follows_its_b_on_the_same_device(make):
    s = make(4, 8)
    for actions in s.devices:
        order = {a: i for i, a in enumerate(actions)}
        assert all(
            order[Action("W", a.stage, a.microbatch)] > i for i, a in enumerate(actions) if a.kind == "B"
        )


def test_blocking_sends_deadlock_1f1b_but_not_gpipe():
    """Why the executor posts non-blocking sends: with rendezvous sends, two neighbours
    in 1F1B's steady phase both send first and wait for each other forever."""
    stuck = check_lowered(lower(one_f_one_b(2, 4)), blocking_sends=True)
    assert [(d, op.kind) for d, op in stuck] == [(0, "send"), (1, "send")]
    assert check_lowered(lower(gpipe(4, 8)), blocking_sends=True) == []
    assert check_lowered(lower(one_f_one_b(2, 4)), blocking_sends=False) == []


def test_lowering_sends_activations_forward_and_gradients_back():
    program = lower(one_f_one_b(2, 2))
    assert [repr(op) for op in program[0]] == [
        "F(0,0)",
        "send[F(0,0) to 1]",
        "F(0,1)",
        "send[F(0,1) to 1]",
        "recv[B(1,0) from 1]",
        "B(0,0)",
        "recv[B(1,1) from 1]",
        "B(0,1)",
    ]
    assert [repr(op) for op in program[1]][:4] == [
        "recv[F(0,0) from 0]",
        "F(1,0)",
        "B(1,0)",
        "send[B(1,0) to 0]",
    ]


# --- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", [one_f_one_b, zero_bubble_h1])
def test_fewer_microbatches_than_devices_is_refused(make):
    with pytest.raises(
        ValueError, match=r"needs at least as many micro-batches as devices \(m >= p\), got m=2, p=4"
    ):
        make(4, 2)


def test_zero_bubble_h2_needs_2p_minus_1_microbatches():
    with pytest.raises(ValueError, match=r"needs m >= 2p-1 micro-batches .* got m=6, p=4: use m >= 7"):
        zero_bubble_h2(4, 6)


def test_interleaved_needs_m_a_multiple_of_p():
    with pytest.raises(ValueError, match="needs m to be a multiple of p .* got m=6, p=4: use m=4 or m=8"):
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="m >= p"):
        interleaved_1f1b(4, 2, 2)


@pytest.mark.parametrize("args", [(0, 4), (2, 0), (2.0, 4), (True, 4), (2, "4")])
def test_p_and_m_must_be_whole_numbers(args):
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        gpipe(*args)


def test_v_must_be_a_whole_number_and_divide_the_layers():
    with pytest.raises(ValueError, match="v must be a whole number >= 1, got 0"):
        interleaved_1f1b(2, 4, 0)
    # 6 layers cannot make p * v = 2 * 2 equal stages
    with pytest.raises(ValueError, match=r"6 layers cannot be cut into 4 equal stages \(p x v = 4\)"):
        MLPConfig(layers=6).stages(4)


# --- validate catches broken schedules --------------------------------------------------------


def _edit(schedule, device, actions):
    devices = list(schedule.devices)
    devices[device] = tuple(actions)
    return Schedule(
        schedule.kind, schedule.p, schedule.m, schedule.v, tuple(devices), schedule.split_backward
    )


def test_validate_names_a_duplicate_a_missing_action_and_a_wrong_device():
    s = one_f_one_b(2, 3)
    with pytest.raises(ValueError, match=r"F\(0,0\) occurs twice"):
        validate(_edit(s, 0, s.devices[0] + (Action("F", 0, 0),)))
    with pytest.raises(ValueError, match=r"missing 1 action\(s\), e.g. B\(0,2\)"):
        validate(_edit(s, 0, s.devices[0][:-1]))
    with pytest.raises(ValueError, match=r"F\(1,0\) is on device 0, but stage 1 lives on device 1"):
        validate(_edit(s, 0, s.devices[0] + (Action("F", 1, 0),)))
    with pytest.raises(ValueError, match="kinds are F/B"):
        validate(_edit(s, 0, s.devices[0] + (Action("W", 0, 0),)))


def test_validate_finds_a_deadlock_and_says_who_waits_for_what():
    s = one_f_one_b(2, 2)
    swapped = (s.devices[1][1], s.devices[1][0]) + s.devices[1][2:]  # B(1,0) before F(1,0)
    with pytest.raises(ValueError, match=r"deadlock.*device 1 waits at B\(1,0\) for F\(1,0\)"):
        validate(_edit(s, 1, swapped))
