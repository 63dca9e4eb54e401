"""Is a schedule runnable? Dependencies between actions, and one order that runs them all.

``validate(schedule)`` checks that every action occurs exactly once, on the
device that holds its stage, and that the per-device orders respect the
dependencies (F(n,m) after F(n-1,m); B(n,m) after F(n,m) and B(n+1,m); W(n,m)
after B(n,m)) without any device waiting forever. ``execution_order`` gives an
order in which every device can run its actions; the simulator and the executor
both follow it.

Taught in chapter 06 (section 2, a schedule checked).
"""

from __future__ import annotations

from course_utils.pipeline.schedules import ACTION_KINDS, Action, Schedule


def dependencies(action: Action, num_stages: int, split_backward: bool) -> list[Action]:
    """The actions whose results ``action`` needs (on any device)."""
    kind, n, j = action
    if kind == "F":
        return [Action("F", n - 1, j)] if n > 0 else []
    if kind == "B":
        return [Action("F", n, j)] + ([Action("B", n + 1, j)] if n < num_stages - 1 else [])
    return [Action("B", n, j)]


def validate(schedule: Schedule) -> Schedule:
    """Raise ValueError, saying what is wrong, unless ``schedule`` is runnable; return it.

    Checks: p lists of actions; each action's kind, stage and micro-batch in
    range and on the device that holds its stage; every action exactly once; and
    that running the lists in order, each action waiting for its dependencies,
    finishes (no device waits for an action that can never run).
    """
    s = schedule
    kinds = ACTION_KINDS if s.split_backward else ("F", "B")
    if len(s.devices) != s.p:
        raise ValueError(f"{s.name}: expected action lists for {s.p} devices, got {len(s.devices)}")
    seen: dict[Action, int] = {}
    for d, actions in enumerate(s.devices):
        for a in actions:
            if a.kind not in kinds or not (0 <= a.stage < s.num_stages) or not (0 <= a.microbatch < s.m):
                raise ValueError(
                    f"{s.name}: device {d} has {a!r}; kinds are {'/'.join(kinds)}, stages "
                    f"0..{s.num_stages - 1}, micro-batches 0..{s.m - 1}"
                )
            if s.device_of(a.stage) != d:
                raise ValueError(
                    f"{s.name}: {a!r} is on device {d}, but stage {a.stage} lives on "
                    f"device {s.device_of(a.stage)} (stage n on device n % p, or as its placement says)"
                )
            if a in seen:
                raise ValueError(
                    f"{s.name}: {a!r} occurs twice (device {d}); each action must run exactly once"
                )
            seen[a] = d
    expected = {Action(k, n, j) for k in kinds for n in range(s.num_stages) for j in range(s.m)}
    missing = sorted(expected - set(seen), key=lambda a: (a.stage, a.microbatch, a.kind))
    if missing:
        raise ValueError(
            f"{s.name}: missing {len(missing)} action(s), e.g. " + ", ".join(map(repr, missing[:5]))
        )
    blocked = run_in_order(s)
    if blocked:
        raise ValueError(
            f"{s.name}: deadlock, no device can go on: "
            + "; ".join(f"device {d} waits at {a!r} for {w!r}" for d, a, w in blocked)
        )
    return s


def execution_order(schedule: Schedule) -> tuple[list[tuple[int, Action]], list[tuple[int, Action, Action]]]:
    """Run every device's list in order, each action once its dependencies are done.

    Returns the ``(device, action)`` pairs in an order in which each comes after its
    dependencies, and, if some device got stuck, per stuck device (device, the
    action it is stuck at, a dependency that has not run); else [].
    """
    s = schedule
    position = [0] * s.p
    done: set[Action] = set()
    order = []
    progress = True
    while progress:
        progress = False
        for d, actions in enumerate(s.devices):
            while position[d] < len(actions):
                action = actions[position[d]]
                if any(dep not in done for dep in dependencies(action, s.num_stages, s.split_backward)):
                    break
                done.add(action)
                order.append((d, action))
                position[d] += 1
                progress = True
    stuck = []
    for d, actions in enumerate(s.devices):
        if position[d] < len(actions):
            action = actions[position[d]]
            waiting = next(
                dep for dep in dependencies(action, s.num_stages, s.split_backward) if dep not in done
            )
            stuck.append((d, action, waiting))
    return order, stuck


def run_in_order(schedule: Schedule) -> list[tuple[int, Action, Action]]:
    """[] when every device's list runs to the end, else each stuck device, the action it
    is stuck at and a dependency that never ran (see ``execution_order``)."""
    return execution_order(schedule)[1]
