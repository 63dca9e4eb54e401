"""Torch's zero-bubble and DualPipeV schedules as the course's ``Schedule``, to simulate beside ours.

``torch.distributed.pipelining`` computes, for every rank, the ordered list of actions
its schedule class will run (``pipeline_order``: ``_Action(stage, F / I / W / B,
micro-batch)``, ``None`` for an idle slot). ``from_torch("ScheduleZBVZeroBubble", p, m)``
computes that list the way the class does, without processes or stages, and returns it
as a ``Schedule`` (torch's ``I``, the input gradient, is the course's ``B``):

    ScheduleZBVZeroBubble          ZB-V: two stages per device placed in a "V" (device d
                                   holds stages d and 2p-1-d), backward split into B and W
    ScheduleInterleavedZeroBubble  ZB-H1 over v stages per device placed round-robin
    ScheduleDualPipeV              DeepSeek's DualPipe folded into a "V" (stages as ZB-V's); it
                                   also runs full backwards (torch's ``B``) and overlapped pairs
                                   ``OVERLAP_F_B`` (a forward of one micro-batch beside a full
                                   backward of another), outside the course's F / B / W

``torch_order`` shows a rank's actions as torch lists them, in the course's notation:
``B+W(n,j)`` a full backward, ``[F(0,5) | B+W(7,1)]`` an overlapped pair. ``from_torch`` costs
them for a compute-only simulator: a pair runs its two parts one after the other (one device's
compute does both; what the overlap hides is the communication of one behind the compute of
the other), and a full backward is ``B`` then ``W`` back to back (its input gradient then
leaves ``W`` earlier than torch's full backward would send it: slightly optimistic).

It calls the class's own (private) ``_calculate_single_rank_operations`` through
``compat.pipeline_order``, so the actions are torch's; a torch without these classes says so.

Taught in chapter 06's appendix 06b (sections 2 and 3, ZB-V and DualPipeV).
"""

from __future__ import annotations

from torch.distributed.pipelining import schedules as torch_schedules

from course_utils.pipeline.schedules import Action, Schedule, ScheduleKind
from course_utils.pipeline.validate import validate
from course_utils.runtime import compat

__all__ = ["from_torch", "torch_order", "TORCH_ZERO_BUBBLE"]

# torch class name -> the course's kind
TORCH_ZERO_BUBBLE = {
    "ScheduleZBVZeroBubble": ScheduleKind.ZB_V,
    "ScheduleInterleavedZeroBubble": ScheduleKind.INTERLEAVED_ZB,
    "ScheduleDualPipeV": ScheduleKind.DUALPIPE_V,
}
V_SHAPED = (ScheduleKind.ZB_V, ScheduleKind.DUALPIPE_V)
# torch's computation type -> the course's actions: I is the input gradient (the course's B),
# B torch's full backward (the course's B then W)
KINDS = {"F": ("F",), "I": ("B",), "W": ("W",), "B": ("B", "W")}


def _letter(action) -> str:
    """Torch's computation type of ``action`` as its letter ("F", "I", "W", "B", "OVERLAP_F_B")."""
    value = getattr(action.computation_type, "value", None)  # "F" (torch 2.13); 1 with str() "F" (2.9)
    return value if isinstance(value, str) else str(action.computation_type)


def _actions(class_name: str, action) -> list[Action]:
    """The course's actions for one of torch's (an overlapped pair: its parts, in order)."""
    letter = _letter(action)
    if letter == "OVERLAP_F_B":
        return [a for sub in action.sub_actions for a in _actions(class_name, sub)]
    if letter not in KINDS:
        raise ValueError(f"{class_name}: action {action} has a kind the course's schedules lack")
    return [Action(kind, action.stage_index, action.microbatch_index) for kind in KINDS[letter]]


def _order(class_name: str, p: int, m: int, v: int) -> tuple[ScheduleKind, dict]:
    if class_name not in TORCH_ZERO_BUBBLE:
        raise ValueError(f"unknown class {class_name!r}; choose one of {sorted(TORCH_ZERO_BUBBLE)}")
    cls = getattr(torch_schedules, class_name, None)
    if cls is None or not compat.computes_pipeline_order(cls):
        raise ValueError(f"this torch has no {class_name} to read (it came with torch 2.6 or later)")
    kind = TORCH_ZERO_BUBBLE[class_name]
    if kind in V_SHAPED and v != 2:
        raise ValueError(f"{class_name} holds exactly 2 stages per device, got v={v}")
    if kind == ScheduleKind.DUALPIPE_V and m < 2 * p:
        raise ValueError(
            f"ScheduleDualPipeV needs m >= 2p (as many micro-batches as stages), got m={m}, p={p}"
        )
    return kind, compat.pipeline_order(cls, p, m, v)  # per rank, torch's action list


def torch_order(class_name: str, p: int, m: int, rank: int, v: int = 2) -> list[str]:
    """Rank ``rank``'s actions as torch's ``class_name`` lists them, in the course's notation."""

    def show(a) -> str:
        if _letter(a) == "OVERLAP_F_B":
            return "[" + " | ".join(show(sub) for sub in a.sub_actions) + "]"
        parts = _actions(class_name, a)
        return "+".join(x.kind for x in parts) + f"({a.stage_index},{a.microbatch_index})"

    return [show(a) for a in _order(class_name, p, m, v)[1][rank] if a is not None]


def from_torch(class_name: str, p: int, m: int, v: int = 2) -> Schedule:
    """Torch's schedule ``class_name`` (a key of ``TORCH_ZERO_BUBBLE``) for ``p`` devices and
    ``m`` micro-batches (``v`` stages per device; ZB-V and DualPipeV have 2) as a validated
    ``Schedule``, costed as the module docstring says."""
    kind, order = _order(class_name, p, m, v)
    devices = tuple(
        tuple(x for a in order[rank] if a is not None for x in _actions(class_name, a)) for rank in range(p)
    )
    placement = tuple(n if n < p else 2 * p - 1 - n for n in range(2 * p)) if kind in V_SHAPED else None
    return validate(Schedule(kind, p, m, v, devices, split_backward=True, placement=placement))
