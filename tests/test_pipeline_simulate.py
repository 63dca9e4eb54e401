"""The simulator against the textbook formulas, the Timeline's measures, plots and traces."""

import json

import matplotlib
import pytest

from course_utils.pipeline import (
    Action,
    Costs,
    Event,
    MLPConfig,
    Timeline,
    chrome_trace,
    expected_bubble_fraction,
    gpipe,
    gpipe_bubble_fraction,
    interleaved_1f1b,
    interleaved_bubble_fraction,
    interleaved_bubble_ratio,
    measured_costs,
    one_f_one_b,
    replay,
    simulate,
    steady_state,
    zb_h1_bubble_time,
    zb_h2_bubble_time,
    zero_bubble_h1,
    zero_bubble_h2,
)
from course_utils.pipeline.from_torch import from_torch
from course_utils.pipeline.modeled import cluster_bubble, crossover_ms, message_ms
from course_utils.pipeline.plot import plot_step_sweep, plot_timeline, plot_timelines
from course_utils.pipeline.simulate import plot_bubble_sweep
from course_utils.runtime.cluster import Cluster, ClusterTimeline, Span

pytestmark = [
    pytest.mark.chapter(6),
    pytest.mark.usefixtures("agg_backend"),  # tests/conftest.py
]


TOL = 1e-12  # unit costs are exact in binary floating point; the tolerance only absorbs summation order
PM = [(p, m) for p in range(1, 7) for m in range(p, 17)]


@pytest.mark.parametrize("p,m", PM)
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    assert gpipe_bubble_fraction(p, m) == (p - 1) / (m + p - 1)
    for schedule in (gpipe(p, m), one_f_one_b(p, m)):
        t = simulate(schedule, Costs(F=1, B=1, W=1))
        assert abs(t.bubble_fraction - (p - 1) / (m + p - 1)) < TOL
        assert t.makespan == (m + p - 1) * 3  # F + full backward (B + W) per micro-batch-stage


@pytest.mark.parametrize("p,m", PM)
def test_peak_activations_m_for_gpipe_p_minus_i_for_1f1b_p_for_zb_h1(p, m):
    assert simulate(gpipe(p, m)).peak_activations() == [m] * p
    assert simulate(one_f_one_b(p, m)).peak_activations() == [p - i for i in range(p)]
    assert simulate(zero_bubble_h1(p, m)).peak_activations() == [p] * p


@pytest.mark.parametrize("p,m", [(p, m) for p in range(1, 6) for m in range(p, 25, p)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_is_p_minus_1_over_vm_of_the_ideal(p, m, v):
    t = simulate(interleaved_1f1b(p, m, v), Costs().per_chunk(v))
    assert abs(t.bubble_ratio - (p - 1) / (v * m)) < TOL
    assert abs(t.bubble_ratio - interleaved_bubble_ratio(p, m, v)) < TOL


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (3, 6), (4, 4), (4, 8), (5, 12)])
@pytest.mark.parametrize(
    "costs",
    [Costs(1, 1, 1), Costs(1, 2, 1), Costs(2, 1, 1), Costs(1, 1, 0.5)],
    ids=lambda c: f"F{c.F:g}B{c.B:g}W{c.W:g}",
)
def test_zb_h1_idles_p_minus_1_times_f_plus_b_minus_w_smaller_than_1f1b(p, m, costs):
    zb, base = simulate(zero_bubble_h1(p, m), costs), simulate(one_f_one_b(p, m), costs)
    for d in range(p):
        assert abs(zb.idle(d) - zb_h1_bubble_time(p, costs)) < TOL
        assert abs(base.idle(d) - (p - 1) * (costs.F + costs.B + costs.W)) < TOL
    if p > 1:
        assert zb.bubble_fraction < base.bubble_fraction


ZB_COSTS = [
    Costs(1, 1, 1),
    Costs(1, 2, 1),
    Costs(2, 1, 1),
    Costs(1, 1, 0.5),
    Costs(1.5, 1, 0.25),
    Costs(1, 1, 0),
]


@pytest.mark.parametrize("p,m", [(p, m) for p in range(2, 7) for m in (2 * p - 1, 2 * p + 3, 4 * p)])
@pytest.mark.parametrize("costs", ZB_COSTS, ids=lambda c: f"F{c.F:g}B{c.B:g}W{c.W:g}")
def test_zb_h2_steps_back_to_back_idle_what_the_paper_says(p, m, costs):
    """Qi et al. (ICLR 2024), Table 1: ZB-H2's bubble is (p-1)(F+B-2W) per device, zero at
    F = B = W, once no synchronization ends a step (optimizer post-validation); it holds
    2p-1 micro-batches at its peak. One synchronous step keeps its ramps."""
    s = zero_bubble_h2(p, m)
    train = steady_state(s, costs)
    for d in range(p):
        assert abs(train.idle[d] - zb_h2_bubble_time(p, costs)) < TOL
    assert max(simulate(s, costs).peak_activations()) == 2 * p - 1
    one_step = simulate(s, Costs(1, 1, 1))
    assert abs(one_step.bubble_fraction - (p - 1) / (p - 1 + 3 * m)) < TOL  # the ramps, (p-1)F per device
    assert abs(steady_state(s, Costs(1, 1, 1)).bubble_fraction) < TOL  # zero bubble at F = B = W


def test_back_to_back_steps_help_only_a_parallelogram():
    """1F1B and ZB-H1 end on the device that starts the next step: no gain. ZB-H2 and torch's
    ZB-V lose their ramps (zero bubble at F = B = W); the interleaved ZB keeps its bubble."""
    c = Costs(1, 1, 1)
    for schedule, costs, one, train in [
        (one_f_one_b(4, 8), c, 9 / 33, 9 / 33),
        (zero_bubble_h1(4, 8), c, 3 / 27, 3 / 27),
        (zero_bubble_h2(4, 8), c, 3 / 27, 0),
        (from_torch("ScheduleZBVZeroBubble", 4, 8), c.per_chunk(2), 1.5 / 25.5, 0),
        (from_torch("ScheduleInterleavedZeroBubble", 4, 8), c.per_chunk(2), 1.5 / 25.5, 1.5 / 25.5),
    ]:
        assert abs(simulate(schedule, costs).bubble_fraction - one) < TOL, schedule.name
        assert abs(steady_state(schedule, costs).bubble_fraction - train) < TOL, schedule.name


def test_expected_bubble_fraction_matches_each_schedule():
    assert interleaved_bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
    for schedule, costs in [
        (gpipe(4, 8), Costs()),
        (one_f_one_b(4, 8), Costs()),
        (interleaved_1f1b(4, 8, 2), Costs().per_chunk(2)),
        (zero_bubble_h1(4, 8), Costs()),
        (zero_bubble_h2(4, 8), Costs()),
        (zero_bubble_h2(3, 9), Costs(1, 2, 1)),
    ]:
        assert (
            abs(simulate(schedule, costs).bubble_fraction - expected_bubble_fraction(schedule, costs)) < TOL
        )
    with pytest.raises(ValueError, match="assumes W <= F and W <= B"):
        zb_h1_bubble_time(4, Costs(F=1, B=1, W=2))
    with pytest.raises(ValueError, match="checked here for W <= F and W <= B"):
        zb_h2_bubble_time(4, Costs(F=1, B=1, W=2))
    with pytest.raises(ValueError, match="one-step ZB-H2 formula"):
        expected_bubble_fraction(zero_bubble_h2(4, 8), Costs(1, 1, 0))


def test_communication_delay_adds_two_hops_per_stage_boundary_for_one_microbatch():
    for p in (2, 3, 4):
        t = simulate(gpipe(p, 1), Costs(F=1, B=1, W=1, comm=0.25))
        assert abs(t.makespan - (p * 3 + 2 * (p - 1) * 0.25)) < TOL


def test_costs_reject_negative_values():
    with pytest.raises(ValueError, match="cost comm must be a number >= 0"):
        Costs(comm=-1)


def test_timeline_grid_of_1f1b():
    assert simulate(one_f_one_b(2, 3), Costs(1, 1, 0)).grid() == (
        "device 0 |F0 F1  . B0 F2 B1  . B2|\ndevice 1 | . F0 B0 F1 B1 F2 B2  .|"
    )


def test_live_activations_rise_at_f_and_fall_after_the_last_backward():
    events = (
        Event(0, Action("F", 0, 0), 0, 1),
        Event(0, Action("F", 0, 1), 1, 2),
        Event(0, Action("B", 0, 0), 2, 3),
        Event(0, Action("W", 0, 0), 4, 5),
        Event(0, Action("B", 0, 1), 5, 6),
        Event(0, Action("W", 0, 1), 6, 7),
    )
    t = Timeline(events, 1)
    assert t.live_activations(0) == [(0, 1), (1, 2), (5, 1), (7, 0)]
    assert t.peak_activations() == [2]
    assert t.makespan == 7 and t.idle(0) == 1 and abs(t.bubble_fraction - 1 / 7) < TOL


def test_timeline_rejects_bad_events():
    with pytest.raises(ValueError, match="0 <= device < 1 and end >= start"):
        Timeline((Event(1, Action("F", 0, 0), 0, 1),), 1)


def test_chrome_trace_has_one_complete_event_per_action(tmp_path):
    t = simulate(one_f_one_b(2, 4))
    path = tmp_path / "trace.json"
    trace = t.to_chrome_trace(path)
    assert json.loads(path.read_text()) == trace
    actions = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(actions) == len(t.events) == 16
    first = next(e for e in actions if e["name"] == "B(1,0)")
    assert (first["tid"], first["ts"], first["dur"], first["cat"]) == (
        1,
        2000.0,
        2000.0,
        "B",
    )  # 1 unit = 1 ms
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {"1F1B", "device 0", "device 1"}
    assert chrome_trace(t) == trace


def test_plots_label_bars_and_print_idle_share():
    fig = plot_timeline(simulate(gpipe(2, 2), Costs(F=2, B=2, W=2)))
    texts = [tx.get_text() for tx in fig.axes[0].texts]
    assert "F(0,0)" in texts and "B(1,1)" in texts and texts.count("idle\n33%") == 2
    assert "bubble 33.3% of device time" in fig.axes[0].get_title()
    assert len(fig.axes) == 2  # Gantt + live activations
    fig = plot_timelines([simulate(gpipe(2, 4)), simulate(one_f_one_b(2, 4))], labels=False)
    assert len(fig.axes) == 2
    assert all(tx.get_text().startswith("idle") for ax in fig.axes for tx in ax.texts)
    fig = plot_bubble_sweep(2, [2, 4, 8])
    assert len(fig.axes[0].lines) == 10  # a formula line and simulated markers per schedule
    matplotlib.pyplot.close("all")


def test_unequal_stages_the_slowest_sets_the_pace():
    """Stage 0 of the MLP skips one input-gradient matmul: with per-stage costs 2+3 vs 2+4
    units, 1F1B on 2 devices idles more than the uniform formula says."""
    t = simulate(one_f_one_b(2, 8), [Costs(2, 3, 0), Costs(2, 4, 0)])
    assert t.makespan == 2 + 8 * 6 + 3  # F(0,0), then device 1 busy throughout, then B(0,7)
    assert abs(t.bubble_fraction - 18 / 106) < TOL
    with pytest.raises(ValueError, match=r"one per stage \(2\), got 3"):
        simulate(one_f_one_b(2, 2), [Costs()] * 3)


def test_measured_costs_recover_the_costs_of_a_timeline():
    costs = [Costs(1, 2, 0.5), Costs(1.5, 2.5, 1)]
    t = simulate(zero_bubble_h1(2, 4), costs)
    assert measured_costs(t, 2) == costs
    t = simulate(one_f_one_b(2, 4), costs)  # no W: B is the whole backward
    assert measured_costs(t, 2) == [Costs(1, 2.5, 0), Costs(1.5, 3.5, 0)]
    assert simulate(one_f_one_b(2, 4), measured_costs(t, 2)).makespan == t.makespan


def test_replay_gives_back_the_simulation_it_replays_with_or_without_messages():
    costs = [Costs(1, 2, 0.5), Costs(1.5, 2.5, 1)]
    for schedule in (one_f_one_b(2, 4), zero_bubble_h1(2, 4), gpipe(2, 1)):
        for comm in (0.0, 0.25):
            run = simulate(schedule, [Costs(c.F, c.B, c.W, comm) for c in costs])
            again = replay(schedule, run, comm)
            assert again.events == run.events and again.makespan == run.makespan
    # each action keeps its own duration: a slower first backward shifts what waits for it
    run = simulate(one_f_one_b(2, 2), Costs(1, 2, 0))
    slower = Timeline(
        tuple(
            Event(e.device, e.action, e.start, e.end + (1 if str(e.action) == "B(1,0)" else 0))
            for e in run.events
        ),
        2,
    )
    assert replay(one_f_one_b(2, 2), slower).makespan == run.makespan + 1
    with pytest.raises(ValueError, match=r"lacks F\(0,2\)"):
        replay(one_f_one_b(2, 3), run)


def test_crossover_is_where_the_replays_meet():
    pair = one_f_one_b(2, 8), interleaved_1f1b(2, 8, 2)
    runs = simulate(pair[0], Costs(1, 2, 0)), simulate(pair[1], Costs(1, 2, 0).per_chunk(2))
    crossing = crossover_ms((pair[0], runs[0]), (pair[1], runs[1]))
    assert crossing is not None and 0 < crossing < 100
    for comm, faster in ((crossing * 0.9, True), (crossing * 1.1, False)):
        gap = replay(pair[1], runs[1], comm).makespan - replay(pair[0], runs[0], comm).makespan
        assert (gap < 0) == faster
    assert crossover_ms((pair[1], runs[1]), (pair[0], runs[0])) is None  # 1F1B is never the faster one


def test_message_time_and_a_cluster_timelines_bubble():
    config = MLPConfig(width=1024, layers=2, batch=256)
    ib = Cluster("h100", "infiniband")
    assert message_ms(ib, config, 4) == pytest.approx((10e-6 + 64 * 1024 * 4 / 50e9) * 1e3, rel=1e-12)
    spans = (
        Span(0, "compute", "F(0,0)", 0, 30),
        Span(1, "compute", "F(1,0)", 40, 100),
        Span(0, "send to 1", "send", 30, 40),
    )
    assert cluster_bubble(ClusterTimeline(spans)) == pytest.approx(1 - 90 / 200)


def test_step_sweep_plot_has_a_line_per_measure():
    timelines = [
        simulate(one_f_one_b(2, m) if m > 1 else gpipe(2, 1), Costs(1 / m, 2 / m, 0)) for m in (1, 2, 4)
    ]
    fig = plot_step_sweep([1, 2, 4], timelines, timelines, title="x")
    assert len(fig.axes[0].lines) == 3
    matplotlib.pyplot.close(fig)
