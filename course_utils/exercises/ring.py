"""Exercise: a ring all-reduce from sends and receives, checked against ``dist.all_reduce``.

The learner writes ``ring_all_reduce(tensor)``: sum ``tensor`` (any shape, float) over the ranks
of the default group, in place, with point-to-point messages (``send``/``recv`` or
``isend``/``irecv``). ``check_ring_all_reduce(fn)`` runs it on 3 gloo ranks on tensors of shape
``[6]`` (3 chunks of 2), ``[7]`` (chunks of 3, 2, 2) and ``[2, 5]``, and compares every rank's
tensor with what ``dist.all_reduce`` gives on the same inputs.

Rank ``r`` starts with ``(i + 1) * 10**r`` at element ``i``, so every digit of a wrong result
says how often one rank's value was counted there: the checker names the missing phase, the
chunk added twice, the tail left out, rather than only "wrong".

Taught in chapter 02 (section 5, all-reduce by hand: the ring).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils.exercises.ranks import first_error, run_candidates
from course_utils.exercises.result import CheckResult, close, ratio, show_values

__all__ = ["check_ring_all_reduce", "check_ring_all_reduce_many", "WORLD_SIZE", "SHAPES"]

WORLD_SIZE = 3
SHAPES = ((6,), (7,), (2, 5))


def rank_input(shape: tuple, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor: ``(i + 1) * 10**rank`` at flat position ``i`` (float32)."""
    n = torch.Size(shape).numel()
    return ((torch.arange(n, dtype=torch.float32) + 1) * 10.0**rank).view(shape)


def _body(fn) -> list[dict]:
    """On one rank: each shape's tensor after ``fn``, what ``fn`` returned, ``dist.all_reduce``'s sum."""
    rank = dist.get_rank()
    runs = []
    for shape in SHAPES:
        expected = rank_input(shape, rank)
        dist.all_reduce(expected)  # the reference: torch's engine on the same input
        tensor = rank_input(shape, rank)
        returned = fn(tensor)
        runs.append(
            {
                "tensor": tensor.clone(),
                "returned": returned.clone() if isinstance(returned, torch.Tensor) else None,
                "expected": expected,
            }
        )
    return runs


def _counts(got: torch.Tensor, world: int) -> torch.Tensor | None:
    """``[n, world]``: how often each rank's value is counted in each element, read off the
    digits of ``got / (i + 1)``; None where the result is not such a count (e.g. divided)."""
    flat = got.reshape(-1).double()
    q = flat / (torch.arange(flat.numel(), dtype=torch.float64) + 1)
    if not torch.allclose(q, q.round(), atol=1e-3) or (q < 0).any() or (q >= 10.0**world).any():
        return None
    q = q.round().long()
    return torch.stack([(q // 10**r) % 10 for r in range(world)], dim=1)


def _chunk_ranges(n: int, world: int) -> list[range]:
    bounds, start = [], 0
    for piece in torch.tensor_split(torch.arange(n), world):
        bounds.append(range(start, start + piece.numel()))
        start += piece.numel()
    return bounds


def _diagnose(shape: tuple, outcomes, even_passed: bool) -> str | None:
    """One sentence on what is wrong for this shape, or None when every rank has the sum."""
    world = len(outcomes)
    what = f"ring_all_reduce on a tensor of shape {list(shape)}"
    runs = [o.data for o in outcomes]
    wrong = [r for r, run in enumerate(runs) if not close(run["tensor"], run["expected"])]
    if not wrong:
        return None
    r = wrong[0]
    got, expected, returned = runs[r]["tensor"], runs[r]["expected"], runs[r]["returned"]
    start = rank_input(shape, r)
    n = expected.numel()
    if got.shape != expected.shape:
        return f"{what}: rank {r}'s tensor has shape {list(got.shape)} afterwards; it must keep {list(shape)}"
    if all(torch.equal(run["tensor"], rank_input(shape, q)) for q, run in enumerate(runs)):
        if returned is not None and close(returned, expected):
            return (
                f"{what}: your function returns the right sum, but the tensor passed in is unchanged "
                "on every rank. all_reduce works in place: write the sums into tensor itself (its "
                "chunks are views of it: add_ and copy_ into them; when it is not 1-D, work on "
                "tensor.view(-1), which shares its memory, not on a reshaped copy)"
            )
        return f"{what}: the tensor is unchanged on every rank: nothing was added into it"
    k = ratio(got, expected)
    if k is not None and abs(k * world - 1) < 1e-3:
        return (
            f"{what}: rank {r}'s result is 1/{world} of the expected sum: did you divide by the world "
            f"size? all_reduce sums (op SUM); averaging gradients is DDP's job (chapter 04)"
        )
    if k is not None:
        return f"{what}: rank {r}'s result is {k:g} times the expected sum"
    counts = _counts(got, world)
    if counts is not None:
        twice = (counts >= 2).nonzero()
        if len(twice):
            i, q = twice[0].tolist()
            return (
                f"{what}: element {i} on rank {r} counts rank {q}'s value {int(counts[i, q])} times: a "
                "chunk was added again. In the all-gather phase the received chunk is already the full "
                "sum: copy it (copy_) over yours instead of adding it; and each phase has world_size - 1 "
                "steps, not more"
            )
        chunks = _chunk_ranges(n, world)
        full = [c for c, span in enumerate(chunks) if len(span) and bool((counts[list(span)] == 1).all())]
        if len(full) == 1 and len(wrong) == world:
            return (
                f"{what}: after your function rank {r} holds the full sum only in chunk {full[0]} "
                f"(elements {chunks[full[0]].start} to {chunks[full[0]].stop - 1}); its other chunks are "
                f"partial sums. That is where reduce-scatter ends: the all-gather phase is missing "
                f"({world - 1} more steps, each passing a finished chunk to the right neighbour, "
                "which copies it in)"
            )
        bad = (counts != 1).any(dim=1).nonzero().flatten().tolist()
        if even_passed and n % world and bad == list(range(n - len(bad), n)):
            return (
                f"{what}: the last {len(bad)} element(s) on rank {r} (from element {bad[0]} on) are not "
                f"summed, while the tensor of {SHAPES[0][0]} elements is right: {n} elements do not "
                f"split evenly over {world} ranks, and your chunks leave the tail out (numel // world "
                f"elements each). torch.tensor_split(flat, world) gives {world} chunks that cover every "
                "element (sizes differ by at most one)"
            )
        if bad:
            i = bad[0]
            have = [q for q in range(world) if counts[i, q] == 1]
            lack = [q for q in range(world) if counts[i, q] == 0]
            return (
                f"{what}: element {i} on rank {r} holds the values of rank(s) {have} only, not of "
                f"rank(s) {lack}: some chunk did not go all the way round the ring (each phase has "
                f"{world - 1} steps; at step s rank r sends chunk (r - s) % {world} in reduce-scatter)"
            )
    diff = (got - expected).abs().reshape(-1).argmax().item()
    return (
        f"{what}: rank {r}'s result differs from dist.all_reduce's: element {diff} is "
        f"{got.reshape(-1)[diff].item():g}, expected {expected.reshape(-1)[diff].item():g} "
        f"(rank {r} got {show_values(got)}, started from {show_values(start)})"
    )


def _result(outcomes_of_fn) -> CheckResult:
    result = CheckResult(
        "ring_all_reduce",
        f"gives dist.all_reduce's sums on every one of {WORLD_SIZE} ranks, in place, for tensors of "
        f"shape {', '.join(str(list(s)) for s in SHAPES)}",
    )
    error = first_error(outcomes_of_fn, "ring_all_reduce")
    if error:
        result.problems.append(error)
        return result
    by_shape = [[o._replace(data=o.data[j]) for o in outcomes_of_fn] for j in range(len(SHAPES))]
    even_passed = _diagnose(SHAPES[0], by_shape[0], False) is None
    for shape, outcomes in zip(SHAPES, by_shape, strict=True):
        problem = _diagnose(shape, outcomes, even_passed)
        if problem:
            result.problems.append(problem)
            break  # the first shape that fails says the most; the others usually repeat it
    return result


def check_ring_all_reduce_many(fns: list, wait_s: float = 5.0) -> list[CheckResult]:
    """``check_ring_all_reduce`` for several functions in one launch (nothing printed)."""
    return [_result(o) for o in run_candidates(_body, fns, world_size=WORLD_SIZE, wait_s=wait_s)]


def check_ring_all_reduce(fn, wait_s: float = 5.0) -> CheckResult:
    """Run ``fn(tensor)`` on 3 gloo ranks against ``dist.all_reduce``; print what differs, or
    one line saying it passed. A rank that waits ``wait_s`` seconds for a message is reported."""
    return check_ring_all_reduce_many([fn], wait_s)[0].shown()
