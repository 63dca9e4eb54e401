"""Lowering a schedule to what each process really does: receive, compute, send.

Per device, each action becomes: receive the tensors it needs from other
devices, compute, send what it produced to the device that needs it next.
F(n,m) sends its output (activation, [b, width]) to stage n+1; B(n,m) sends the
gradient of its input (same shape) to stage n-1. A message is named by the
action that produced it.

Whether that program finishes depends on how a send behaves:

* non-blocking (``isend``): a send returns at once; a receive waits for its
  message. Then the program finishes exactly when the schedule respects the
  dependencies, and ``check_lowered`` proves it for a given schedule. That is gloo,
  whose messages progress in the background; on NCCL a send may wait on the GPU for
  its receiver unless it is buffered, so the course posts each message together with
  the one it meets (``dist.batch_isend_irecv``: ``plain``, ``executor``).
* blocking (rendezvous): a send also waits until the receiver is at the
  matching receive. Two devices that both send first then wait for each other
  forever; 1F1B does exactly that (``blocking_sends=True`` shows it).

Taught in chapter 06's appendix 06a (section 1, from a schedule to messages).
"""

from __future__ import annotations

from typing import NamedTuple

from course_utils.pipeline.schedules import Action, Schedule
from course_utils.pipeline.validate import dependencies


class Op(NamedTuple):
    """``kind`` "recv", "compute" or "send"; ``action``: the computed action, or for a
    message the action that produced it; ``peer``: the device it comes from or goes to."""

    kind: str
    action: Action
    peer: int = -1

    def __repr__(self) -> str:
        if self.kind == "compute":
            return repr(self.action)
        return f"{self.kind}[{self.action!r} {'from' if self.kind == 'recv' else 'to'} {self.peer}]"


def consumer_stage(action: Action) -> int | None:
    """The stage that needs ``action``'s output: n+1 for F, n-1 for B; W sends nothing."""
    return {"F": action.stage + 1, "B": action.stage - 1}.get(action.kind)


def lower(schedule: Schedule) -> list[list[Op]]:
    """Per device, the list of receive / compute / send operations, in order."""
    s = schedule
    program = []
    for d, actions in enumerate(s.devices):
        ops = []
        for action in actions:
            for dep in dependencies(action, s.num_stages, s.split_backward):
                if dep.stage != action.stage and s.device_of(dep.stage) != d:
                    ops.append(Op("recv", dep, s.device_of(dep.stage)))
            ops.append(Op("compute", action))
            target = consumer_stage(action)
            if target is not None and 0 <= target < s.num_stages and s.device_of(target) != d:
                ops.append(Op("send", action, s.device_of(target)))
        program.append(ops)
    return program


def check_lowered(program: list[list[Op]], blocking_sends: bool = False) -> list[tuple[int, Op]]:
    """Execute ``program`` symbolically; return [] if every device finishes, else each
    stuck device and the operation it is stuck at (a deadlock)."""
    position = [0] * len(program)
    sent: set[tuple[Action, int]] = set()  # (message, receiving device), for non-blocking sends

    def current(d):
        return program[d][position[d]] if position[d] < len(program[d]) else None

    progress = True
    while progress:
        progress = False
        for d in range(len(program)):
            op = current(d)
            while op is not None:
                if op.kind == "compute":
                    position[d] += 1
                elif op.kind == "send" and not blocking_sends:
                    sent.add((op.action, op.peer))
                    position[d] += 1
                elif op.kind == "send":  # rendezvous: both sides advance together
                    if current(op.peer) != Op("recv", op.action, d):
                        break
                    position[d] += 1
                    position[op.peer] += 1
                elif (op.action, d) in sent:  # a receive whose message was sent
                    position[d] += 1
                else:
                    break
                progress = True
                op = current(d)
    return [(d, current(d)) for d in range(len(program)) if current(d) is not None]
