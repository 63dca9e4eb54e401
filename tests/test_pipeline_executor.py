"""The executor on real processes (gloo): gradients equal to the unpipelined model, the
measured timeline has the schedule's actions in the schedule's order, and
torch.distributed.pipelining computes the same loss and gradients."""

import pytest
import torch
from helpers.p2p import only_batched_p2p

from course_utils import Cluster, launch
from course_utils.pipeline import (
    MLPConfig,
    Op,
    gpipe,
    interleaved_1f1b,
    lower,
    one_f_one_b,
    reference_step,
    replay,
    run_schedule,
    run_schedules,
    zero_bubble_h1,
)
from course_utils.pipeline.executor import StageWorker, batches
from course_utils.pipeline.modeled import cluster_bubble, message_ms, where_time_goes
from course_utils.pipeline.runs import collect, pipeline_rank
from course_utils.pipeline.schedules import ScheduleKind
from course_utils.pipeline.torch_pipelining import compare_with_torch, run_torch_pipeline

pytestmark = [pytest.mark.chapter(6), pytest.mark.launches]

CONFIG = MLPConfig(width=32, layers=4, batch=24, seed=3)
TIMEOUT = 60  # seconds; a deadlock fails the test instead of hanging it
ATOL, RTOL = 1e-6, 1e-5  # float32 sums over micro-batches in another order than over the whole batch


@pytest.fixture(scope="module")
def reference():
    return reference_step(CONFIG)


def assert_same(grads, ref_grads):
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.parametrize(
    "schedule",
    [
        gpipe(1, 2),
        gpipe(2, 4),
        one_f_one_b(2, 4),
        one_f_one_b(4, 4),
        interleaved_1f1b(2, 4, 2),
        zero_bubble_h1(2, 6),
        zero_bubble_h1(4, 4),
    ],
    ids=lambda s: f"{s.name}-p{s.p}-m{s.m}-v{s.v}",
)
def test_executor_gradients_equal_the_unpipelined_model(schedule, reference):
    run = run_schedule(schedule, CONFIG, steps=1, warmup=0, timeout=TIMEOUT)
    ref_loss, ref_grads = reference
    assert abs(run.loss - ref_loss) < 1e-6
    assert_same(run.grads, ref_grads)
    # the measured timeline: the schedule's actions, per device in the schedule's order, never overlapping
    t = run.timeline
    for d, actions in enumerate(schedule.devices):
        events = t.on(d)
        assert tuple(e.action for e in events) == actions
        assert all(a.end <= b.start for a, b in zip(events, events[1:], strict=False))
    assert 0 <= t.bubble_fraction < 1 and t.unit == "ms"


def test_executor_repeats_steps_and_exports_a_trace(tmp_path):
    run = run_schedule(one_f_one_b(2, 2), CONFIG, steps=3, warmup=1, timeout=TIMEOUT)
    assert len(run.timelines) == len(run.step_times_ms) == 3 and run.timeline in run.timelines
    assert all(t > 0 for t in run.step_times_ms)
    trace = run.timeline.to_chrome_trace(tmp_path / "trace.json")
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 8


@pytest.mark.parametrize(
    "schedule", [gpipe(2, 4), one_f_one_b(2, 4), interleaved_1f1b(2, 4, 2)], ids=lambda s: s.name
)
def test_torch_pipelining_agrees_with_the_executor(schedule, reference):
    ours, theirs = compare_with_torch(schedule, CONFIG, steps=2, warmup=0, timeout=TIMEOUT)
    assert len(ours.step_times_ms) == len(theirs.step_times_ms) == 2
    assert abs(ours.loss - theirs.loss) < 1e-6 and abs(theirs.loss - reference[0]) < 1e-6
    assert_same(ours.grads, reference[1])
    assert_same(theirs.grads, ours.grads)


def test_torch_pipelining_alone_and_several_schedules_in_turns(reference):
    theirs = run_torch_pipeline("1f1b", 2, 4, CONFIG, steps=1, warmup=0, timeout=TIMEOUT)
    assert_same(theirs.grads, reference[1])
    runs = run_schedules([gpipe(2, 1), zero_bubble_h1(2, 4)], CONFIG, steps=2, warmup=1, timeout=TIMEOUT)
    assert [len(r.timelines) for r in runs] == [2, 2]
    for run in runs:
        assert_same(run.grads, reference[1])
    assert runs[1].fastest.peak_activations() == [2, 2]


# --- on a modeled cluster: exact times, a timeline per step, real sizes on meta ---------------

IB = Cluster("h100", "infiniband")


def in_ns(timeline):
    """The events with their times in whole ns (ms floats from different starts differ in the last bit)."""
    return [(e.device, e.action, round(e.start * 1e6), round(e.end * 1e6)) for e in timeline.events]


def test_on_a_modeled_cluster_every_step_is_the_same_and_meta_prices_what_real_tensors_cost(reference):
    schedules = [gpipe(2, 1), one_f_one_b(2, 4)]
    real = run_schedules(schedules, CONFIG, steps=2, warmup=0, timeout=TIMEOUT, cluster=IB)
    meta = run_schedules(schedules, CONFIG, steps=1, warmup=0, timeout=TIMEOUT, cluster=IB, meta=True)
    for run, priced in zip(real, meta, strict=True):
        assert len({round(ms * 1e6) for ms in run.step_times_ms + priced.step_times_ms}) == 1  # ns
        assert in_ns(run.timelines[0]) == in_ns(run.timelines[1]) == in_ns(priced.timeline)
        assert len(run.cluster_timelines) == 2 and priced.grads == {} and priced.loss == 0
    assert_same(real[1].grads, reference[1])  # the numbers are untouched by the cluster
    # the cluster's own timeline: each action a named compute span, each message on its lane
    step = real[1].cluster_timeline
    assert [s.name for s in step.on(0, "compute") if "(" in s.name] == [
        str(a) for a in schedules[1].devices[0]
    ]
    assert len(step.on(0, "send to 1")) == len(step.on(1, "send to 0")) == 4
    # the naive split waits only for its two messages: replayed with their time, the same step
    naive = real[0].timeline
    assert replay(gpipe(2, 1), naive, message_ms(IB, CONFIG, 1)).makespan == pytest.approx(
        naive.makespan, abs=1e-6
    )
    parts = where_time_goes(one_f_one_b(2, 4), real[1].timeline, message_ms(IB, CONFIG, 4))
    steps = [parts[k][0] for k in ("replay, messages free", "replay, messages paid", "measured")]
    assert steps == sorted(steps) and parts["formula"] == (None, 0.2)


def test_meta_needs_a_modeled_cluster():
    with pytest.raises(ValueError, match="only a modeled cluster can time it"):
        run_schedule(one_f_one_b(2, 2), CONFIG, meta=True)


def test_torch_pipelining_on_a_modeled_cluster_gives_its_timeline(reference):
    ours, theirs = compare_with_torch(
        one_f_one_b(2, 4), CONFIG, steps=1, warmup=1, timeout=TIMEOUT, cluster=IB
    )
    assert_same(theirs.grads, reference[1])
    for run in (ours, theirs):
        assert 0 < cluster_bubble(run.cluster_timeline) < 1
        assert run.cluster_timeline.makespan_ns / 1e6 == pytest.approx(run.step_time_ms, rel=1e-3)
    assert theirs.step_time_ms > ours.step_time_ms  # torch's 1F1B waits for each send in its steady phase


# --- messages in batches (batch_isend_irecv), safe where a send waits for its receive -------


def pipeline_rank_with_only_batched_p2p(schedules, config, steps):
    """``pipeline_rank`` with lone isend / irecv / send / recv forbidden; also the kinds of
    the ops in each batch this rank posted."""
    with only_batched_p2p() as posted:
        results = pipeline_rank(schedules, config, steps)
    return results, [sorted(name for name, _ in b) for b in posted]


@pytest.mark.parametrize(
    "schedules",
    [
        [gpipe(2, 4), one_f_one_b(2, 4), interleaved_1f1b(2, 4, 2), zero_bubble_h1(2, 6)],
        [gpipe(4, 4), one_f_one_b(4, 4), zero_bubble_h1(4, 4)],
    ],
    ids=["p2", "p4"],
)
def test_executor_posts_every_message_in_a_batch(schedules, reference):
    p = schedules[0].p
    per_rank = launch(
        pipeline_rank_with_only_batched_p2p,
        schedules,
        CONFIG,
        1,
        world_size=p,
        timeout=TIMEOUT,
        show_output=False,
    )
    for i, schedule in enumerate(schedules):
        run = collect([results[i] for results, _ in per_rank], warmup=0, schedule=schedule)
        assert abs(run.loss - reference[0]) < 1e-6, schedule.name
        assert_same(run.grads, reference[1])
        for d, actions in enumerate(schedule.devices):
            assert tuple(e.action for e in run.timeline.on(d)) == actions
    posted = [b for _, rank_batches in per_rank for b in rank_batches]
    assert all(posted) and ["irecv", "isend"] in posted  # sends and receives posted together


def rendezvous_stuck(plans: list) -> list:
    """Run per-device plans (compute ops and lists of messages, as ``batches`` returns) as NCCL
    may: a device's batches one after another, a message done once both its ends are in their
    current batch (a send may wait for its receive), a batch done when all its messages are.
    A compute only waits for an earlier batch of its device, so it never blocks here.
    Returns the devices that never finish."""
    queues = [[b for b in plan if isinstance(b, list)] for plan in plans]
    position, done = [0] * len(queues), [set() for _ in queues]

    def current(d):
        return queues[d][position[d]] if position[d] < len(queues[d]) else []

    progress = True
    while progress:
        progress = False
        for d in range(len(queues)):
            for op in current(d):
                receive = Op("recv", op.action, d)
                if op.kind == "send" and op not in done[d] and receive in current(op.peer):
                    done[d].add(op)
                    done[op.peer].add(receive)
                    progress = True
            if current(d) and done[d] >= set(current(d)):
                position[d] += 1
                done[d] = set()
                progress = True
    return [d for d in range(len(queues)) if position[d] < len(queues[d])]


def between_computes(program: list) -> list:
    """The lowered program with its consecutive messages in one batch, in program order."""
    plan = []
    for op in program:
        if op.kind != "compute" and plan and isinstance(plan[-1], list):
            plan[-1].append(op)
        else:
            plan.append([op] if op.kind != "compute" else op)
    return plan


def some_schedules():
    for p in (1, 2, 3, 4, 5):
        for m in range(1, 11):
            yield gpipe(p, m)
            if m >= p:
                yield from (one_f_one_b(p, m), zero_bubble_h1(p, m))
                if m % p == 0:
                    yield from (interleaved_1f1b(p, m, 2), interleaved_1f1b(p, m, 3))


def test_batched_messages_never_wait_for_each_other():
    for schedule in some_schedules():
        program = lower(schedule)
        plans = [batches(ops, schedule) for ops in program]
        for ops, plan in zip(program, plans, strict=False):  # the same ops, computes in their order
            flat = [op for item in plan for op in (item if isinstance(item, list) else [item])]
            assert sorted(flat) == sorted(ops)
            assert [op for op in flat if op.kind == "compute"] == [op for op in ops if op.kind == "compute"]
        assert rendezvous_stuck(plans) == [], schedule
        # NCCL matches messages between two devices by order: the same order at both ends
        for a in range(schedule.p):
            for b in range(schedule.p):
                sent = [
                    op.action
                    for item in plans[a]
                    if isinstance(item, list)
                    for op in item
                    if op.kind == "send" and op.peer == b
                ]
                received = [
                    op.action
                    for item in plans[b]
                    if isinstance(item, list)
                    for op in item
                    if op.kind == "recv" and op.peer == a
                ]
                assert sent == received, (schedule, a, b)


def test_why_messages_are_posted_by_step():
    def one_by_one(s):
        return [[[op] if op.kind != "compute" else op for op in ops] for ops in lower(s)]

    assert rendezvous_stuck(one_by_one(one_f_one_b(2, 3))) == [0, 1]  # each sends first: stuck

    def paired(s):
        return [between_computes(ops) for ops in lower(s)]

    assert rendezvous_stuck(paired(one_f_one_b(2, 3))) == []  # send + receive together: fine
    assert rendezvous_stuck(paired(interleaved_1f1b(2, 4, 2))) == [0, 1]  # but not for interleaved
    s = interleaved_1f1b(2, 4, 2)
    assert rendezvous_stuck([batches(ops, s) for ops in lower(s)]) == []


def test_split_backward_b_then_w_equals_autograd():
    """B (input gradient) + W (weight gradient) by hand == one autograd backward, in one process."""
    torch.manual_seed(0)
    module = MLPConfig(width=8, layers=2).build()
    x, grad_out = torch.randn(5, 8), torch.randn(5, 8)
    worker = StageWorker(module, stage=1, num_stages=3, m=1, split_backward=True)
    worker.forward(0, x.clone(), None)
    grad_x = worker.backward(0, grad_out)
    assert all(p.grad is None for p in module.parameters()), "B must not compute weight gradients"
    worker.weight(0)
    ours = [p.grad.clone() for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    x_ref = x.clone().requires_grad_(True)
    module(x_ref).backward(grad_out)
    torch.testing.assert_close(grad_x, x_ref.grad)
    for g, p in zip(ours, module.parameters(), strict=False):
        torch.testing.assert_close(g, p.grad)


def test_split_backward_refuses_layers_it_cannot_split():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with pytest.raises(ValueError, match=r"nn.Linear layers only; stage 0 also has parameters \['1.weight'"):
        StageWorker(module, 0, 2, 2, split_backward=True)


def test_bad_sizes_fail_before_any_process_starts():
    with pytest.raises(ValueError, match="4 layers cannot be cut into 3 equal stages"):
        run_schedule(one_f_one_b(3, 3), CONFIG)
    with pytest.raises(ValueError, match="batch 24 cannot be cut into 5 equal micro-batches"):
        run_schedule(gpipe(2, 5), CONFIG)
    with pytest.raises(ValueError, match="v > 1 .* goes with 'interleaved_1f1b' only"):
        run_torch_pipeline(ScheduleKind.ONE_F_ONE_B, 2, 4, CONFIG, v=2)
    with pytest.raises(
        ValueError, match=r"unknown schedule 'zero_bubble_h1'; choose one of \['gpipe', '1f1b', "
    ):
        run_torch_pipeline(ScheduleKind.ZERO_BUBBLE_H1, 2, 4, CONFIG)
    with pytest.raises(ValueError, match="no torch schedule is compared with 'ZB-H1'"):
        compare_with_torch(zero_bubble_h1(2, 4), CONFIG)
    with pytest.raises(ValueError, match=r"need the same p, got \[2, 3\]"):
        run_schedules([gpipe(2, 2), gpipe(3, 3)], MLPConfig(layers=6))
