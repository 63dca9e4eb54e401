"""Torch's zero-bubble schedules as the course's ``Schedule``, to simulate beside ZB-H1.

``torch.distributed.pipelining`` computes, for every rank, the ordered list of actions
its schedule class will run (``pipeline_order``: ``_Action(stage, F / I / W / B,
micro-batch)``, ``None`` for an idle slot). ``from_torch("ScheduleZBVZeroBubble", p, m)``
computes that list the way the class does, without processes or stages, and returns it
as a ``Schedule`` (torch's ``I``, the input gradient, is the course's ``B``):

    ScheduleZBVZeroBubble          ZB-V: two stages per device placed in a "V" (device d
                                   holds stages d and 2p-1-d), backward split into B and W
    ScheduleInterleavedZeroBubble  ZB-H1 over v stages per device placed round-robin

It calls the class's own (private) ``_calculate_single_rank_operations`` through
``compat.pipeline_order``, so the actions are torch's; a torch without these classes says so.

Taught in chapter 06 (section 7, side by side).
"""

from __future__ import annotations

from torch.distributed.pipelining import schedules as torch_schedules

from course_utils.pipeline.schedules import Action, Schedule, ScheduleKind
from course_utils.pipeline.validate import validate
from course_utils.runtime import compat

__all__ = ["from_torch", "TORCH_ZERO_BUBBLE"]

# torch class name -> (the course's kind, stages per device)
TORCH_ZERO_BUBBLE = {
    "ScheduleZBVZeroBubble": ScheduleKind.ZB_V,
    "ScheduleInterleavedZeroBubble": ScheduleKind.INTERLEAVED_ZB,
}
KINDS = {"F": "F", "I": "B", "W": "W"}  # torch's computation type -> the course's action kind


def from_torch(class_name: str, p: int, m: int, v: int = 2) -> Schedule:
    """Torch's schedule ``class_name`` (a key of ``TORCH_ZERO_BUBBLE``) for ``p`` devices and
    ``m`` micro-batches (``v`` stages per device; ZB-V has 2) as a validated ``Schedule``."""
    if class_name not in TORCH_ZERO_BUBBLE:
        raise ValueError(f"unknown class {class_name!r}; choose one of {sorted(TORCH_ZERO_BUBBLE)}")
    cls = getattr(torch_schedules, class_name, None)
    if cls is None or not compat.computes_pipeline_order(cls):
        raise ValueError(f"this torch has no {class_name} to read (it came with torch 2.6 or later)")
    kind = TORCH_ZERO_BUBBLE[class_name]
    if kind == ScheduleKind.ZB_V and v != 2:
        raise ValueError(f"ScheduleZBVZeroBubble holds exactly 2 stages per device, got v={v}")
    order = compat.pipeline_order(cls, p, m, v)  # per rank, torch's action list
    devices = []
    for rank in range(p):
        actions = []
        for a in order[rank]:
            if a is None:
                continue
            value = getattr(a.computation_type, "value", None)  # "F" (torch 2.13); 1 with str() "F" (2.9)
            kind_letter = value if isinstance(value, str) else str(a.computation_type)
            if kind_letter not in KINDS:
                raise ValueError(f"{class_name}: action {a} has a kind the course's split schedules lack")
            actions.append(Action(KINDS[kind_letter], a.stage_index, a.microbatch_index))
        devices.append(tuple(actions))
    placement = (
        tuple(n if n < p else 2 * p - 1 - n for n in range(2 * p)) if kind == ScheduleKind.ZB_V else None
    )
    return validate(Schedule(kind, p, m, v, tuple(devices), split_backward=True, placement=placement))
