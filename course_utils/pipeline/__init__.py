"""Pipeline parallelism: schedules as data, a simulator, a real executor, plots.

    from course_utils.pipeline import one_f_one_b, simulate, Costs, run_schedule

    schedule = one_f_one_b(p=4, m=8)        # per device, the ordered F/B actions
    timeline = simulate(schedule, Costs())  # per device, timed events
    timeline.bubble_fraction, timeline.peak_activations(), timeline.plot()
    run_schedule(schedule, MLPConfig(...))  # real processes, the same Timeline, measured

Modules: ``schedules`` (actions, the five schedules and their kinds), ``lowering``
(receive / compute / send programs, deadlock check), ``timeline`` (the Timeline
type), ``simulate`` (costs, simulator, formulas), ``plot``, ``trace`` (Chrome /
Perfetto JSON), ``mlp`` (the model cut into stages), ``executor`` (one process's
stages and program, one step at a time), ``runs`` (real processes started, their
steps measured), ``torch_pipelining`` (the same through torch.distributed.pipelining),
``modeled`` (a step measured on a modeled cluster taken apart: message times, replays, the
bubble of a cluster timeline), ``vertical`` (chapter 05's vertical split on ranks, one step
measured as a Timeline), ``recompute``
(activation recomputation measured on one stage), ``plain`` (1F1B written out by hand, the
optimizer step after the flush), ``pipeline_dp`` (pipeline copies trained data parallel).

Taught in chapter 06.
"""

from course_utils.pipeline.lowering import Op, check_lowered, lower
from course_utils.pipeline.mlp import MLPConfig, reference_step
from course_utils.pipeline.pipeline_dp import run_pipeline_training, train_one_process
from course_utils.pipeline.plain import train_step_1f1b
from course_utils.pipeline.recompute import measure_recompute
from course_utils.pipeline.runs import MeasuredRun, PipelineRun, run_schedule, run_schedules
from course_utils.pipeline.schedules import (
    SCHEDULE_KINDS,
    SCHEDULES,
    Action,
    Schedule,
    ScheduleKind,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zero_bubble_h1,
    zero_bubble_h2,
)
from course_utils.pipeline.simulate import (
    Costs,
    SteadyState,
    expected_bubble_fraction,
    gpipe_bubble_fraction,
    interleaved_bubble_fraction,
    interleaved_bubble_ratio,
    measured_costs,
    repeat_steps,
    replay,
    simulate,
    steady_state,
    zb_h1_bubble_time,
    zb_h2_bubble_time,
)
from course_utils.pipeline.timeline import Event, Timeline
from course_utils.pipeline.trace import chrome_trace
from course_utils.pipeline.validate import run_in_order, validate

__all__ = [
    "Action",
    "Schedule",
    "ScheduleKind",
    "SCHEDULE_KINDS",
    "gpipe",
    "one_f_one_b",
    "interleaved_1f1b",
    "zero_bubble_h1",
    "zero_bubble_h2",
    "SCHEDULES",
    "validate",
    "run_in_order",
    "Op",
    "lower",
    "check_lowered",
    "Event",
    "Timeline",
    "Costs",
    "simulate",
    "expected_bubble_fraction",
    "gpipe_bubble_fraction",
    "interleaved_bubble_ratio",
    "interleaved_bubble_fraction",
    "zb_h1_bubble_time",
    "zb_h2_bubble_time",
    "repeat_steps",
    "steady_state",
    "SteadyState",
    "measured_costs",
    "replay",
    "MLPConfig",
    "reference_step",
    "MeasuredRun",
    "PipelineRun",
    "run_schedule",
    "run_schedules",
    "chrome_trace",
    "train_step_1f1b",
    "run_pipeline_training",
    "train_one_process",
    "measure_recompute",
]
