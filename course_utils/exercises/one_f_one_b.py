"""Exercise: the 1F1B order of each pipeline stage, checked against ``pipeline.schedules``.

The learner writes ``one_f_one_b_order(stages, microbatches)``: for ``p`` stages (one per device)
and ``m >= p`` micro-batches, one list per stage of the actions it runs, in order: ``"F3"`` is
the forward of micro-batch 3, ``"B0"`` the backward of micro-batch 0 (``("F", 3)`` or the
course's ``Action`` work too). 1F1B (PipeDream-Flush): stage ``d`` warms up with ``p - 1 - d``
forwards, then alternates one forward and one backward, then runs the backwards left.
``check_one_f_one_b_order(fn)`` compares its lists for ``(p, m)`` = (2, 4), (3, 5), (4, 4) and
(4, 8) with the course's schedule (``pipeline.schedules.one_f_one_b``; torch's ``Schedule1F1B``
computes its order only while it runs, on its stages' processes). Pure lists: no ranks needed.

Taught in chapter 06 (section 3, 1F1B).
"""

from __future__ import annotations

import re

from course_utils.exercises.result import CheckResult
from course_utils.pipeline.schedules import one_f_one_b

__all__ = ["check_one_f_one_b_order", "check_one_f_one_b_order_many", "CASES"]

CASES = ((2, 4), (3, 5), (4, 4), (4, 8))
_ACTION = re.compile(r"^\s*([FB])\s*\(?\s*(\d+)\s*\)?\s*$")


class _Unreadable(Exception):
    pass


def _name(action) -> str:
    """``"F3"`` for ``"F3"``, ``"F 3"``, ``"F(3)"``, ``("F", 3)`` or ``Action("F", stage, 3)``."""
    if isinstance(action, str):
        found = _ACTION.match(action)
        if found:
            return found.group(1) + found.group(2)
    elif isinstance(action, tuple) and len(action) in (2, 3) and action[0] in ("F", "B"):
        return f"{action[0]}{int(action[-1])}"
    raise _Unreadable(
        f"an action {action!r} is not one the checker reads: write 'F3' for the forward of micro-batch "
        "3 and 'B0' for the backward of micro-batch 0 (or the tuples ('F', 3), ('B', 0))"
    )


def _warmup(order: list[str]) -> int:
    """Forwards before the first backward (the warm-up ones and the first of the steady phase)."""
    return next((i for i, a in enumerate(order) if a[0] == "B"), len(order))


def _stage_problem(p: int, m: int, d: int, got: list[str], want: list[str]) -> str | None:
    where = f"with {p} stages and {m} micro-batches, stage {d}"
    for kind, label in (("F", "forward"), ("B", "backward")):
        for j in range(m):
            count = got.count(f"{kind}{j}")
            if count != 1:
                return (
                    f"{where} runs {kind}{j} {count} times: every micro-batch's {label} runs once on "
                    f"every stage ({m} forwards and {m} backwards per stage"
                    + (", the last ones in the cool-down)" if kind == "B" else ")")
                )
    extra = [a for a in got if not (a[1:].isdigit() and int(a[1:]) < m)]
    if extra or len(got) != 2 * m:
        return f"{where} has {len(got)} actions ({', '.join(extra[:3]) or 'none unknown'}); expected {2 * m}"
    for j in range(m):
        if got.index(f"B{j}") < got.index(f"F{j}"):
            return f"{where} runs B{j} before F{j}: a micro-batch's backward needs its forward's activations"
    warm, expected_warm = _warmup(got), min(p - d, m)
    if warm != expected_warm:
        if warm == m:
            why = (
                f"all forwards, then all backwards: that is GPipe's order. 1F1B alternates after "
                f"p - 1 - d = {p - 1 - d} warm-up forwards, so that stage {d} holds at most {p - d} "
                "micro-batches' activations"
            )
        elif warm == d + 1:
            why = (
                "the warm-up counts are reversed: the first stage warms up longest (p - 1 forwards) and the "
                "last stage not at all, since its forward is the first to have a loss to backpropagate"
            )
        elif warm == expected_warm + 1:
            why = f"one forward too many: stage d warms up with p - 1 - d = {p - 1 - d}, then F, B, F, B..."
        elif warm == expected_warm - 1:
            why = (
                f"one forward too few: after p - 1 - d = {p - 1 - d} warm-up forwards comes one more "
                "forward, then its backward pairs begin (F, B, F, B...)"
            )
        else:
            why = f"expected {expected_warm} (p - 1 - d = {p - 1 - d} warm-up forwards, then F, B, F, B...)"
        return f"{where} runs {warm} forward(s) before its first backward: {why}"
    backwards = [int(a[1:]) for a in got if a[0] == "B"]
    if backwards != sorted(backwards):
        return (
            f"{where} runs its backwards in the order {backwards}: they run in micro-batch order, "
            "first in, first out (B0 first)"
        )
    slot = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    if slot is not None:
        return (
            f"the order of stage {d} (with {p} stages and {m} micro-batches) differs at slot {slot}: "
            f"expected {want[slot]}, got {got[slot]}"
        )
    return None


def _check(fn) -> CheckResult:
    result = CheckResult(
        "one_f_one_b_order",
        "gives the 1F1B order of every stage for (stages, micro-batches) = "
        + ", ".join(f"({p}, {m})" for p, m in CASES),
    )
    for p, m in CASES:
        schedule = one_f_one_b(p, m)
        want = [[f"{a.kind}{a.microbatch}" for a in actions] for actions in schedule.devices]
        try:
            returned = fn(p, m)
            got = [[_name(a) for a in stage] for stage in returned]
        except _Unreadable as exc:
            result.problems.append(f"with {p} stages and {m} micro-batches: {exc}")
            return result
        except Exception as exc:
            result.problems.append(
                f"with {p} stages and {m} micro-batches your function raised {type(exc).__name__}: {exc}"
            )
            return result
        if len(got) != p:
            result.problems.append(
                f"with {p} stages and {m} micro-batches your function returned {len(got)} lists: "
                "return one list of actions per stage"
            )
            return result
        for d in range(p):
            problem = _stage_problem(p, m, d, got[d], want[d])
            if problem:
                result.problems.append(problem)
                return result
    return result


def check_one_f_one_b_order_many(fns: list) -> list[CheckResult]:
    """``check_one_f_one_b_order`` for several functions (nothing printed)."""
    return [_check(fn) for fn in fns]


def check_one_f_one_b_order(fn) -> CheckResult:
    """Compare ``fn(stages, microbatches)`` with the course's 1F1B schedule; print what differs,
    or one line saying it passed."""
    return _check(fn).shown()
