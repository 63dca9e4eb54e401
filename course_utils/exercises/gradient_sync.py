"""Exercise: average the gradients in buckets after backward, checked against torch's DDP.

The learner writes ``bucketed_gradient_sync(model, bucket_bytes)``: called on every rank after
``loss.backward()``, it leaves in each ``p.grad`` the average of that gradient over the ranks,
sending the gradients in buckets of at most ``bucket_bytes`` (a gradient larger than that alone):
one ``dist.all_reduce`` per bucket, not per parameter. ``check_bucketed_gradient_sync(fn)`` runs
it on 2 gloo ranks, each with its own batch, on a small MLP (``Linear(4, 8), ReLU, Linear(8, 3)``:
gradients of 128, 32, 96 and 12 bytes) and compares every gradient with what
``torch.nn.parallel.DistributedDataParallel`` computes from the same weights and batches; it
counts the all-reduces too (``runtime.taps``), for ``bucket_bytes`` 160 and 4096.

Taught in chapter 04 (section 5, gradient buckets).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from course_utils.exercises.ranks import first_error, run_candidates
from course_utils.exercises.result import CheckResult, close, ratio
from course_utils.runtime.taps import tap_collectives

__all__ = ["check_bucketed_gradient_sync", "check_bucketed_gradient_sync_many", "WORLD_SIZE", "BUCKET_BYTES"]

WORLD_SIZE = 2
BUCKET_BYTES = (160, 4096)


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _grads(model: nn.Module) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _body(fn) -> list[dict]:
    """On one rank, per bucket size: DDP's gradients, this rank's own, and ``fn``'s, with the
    bytes of each all-reduce ``fn`` made."""
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    runs = []
    for bucket_bytes in BUCKET_BYTES:
        model = small_model()
        reference = DistributedDataParallel(copy.deepcopy(model))
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
        x, y = torch.randn(5, 4, generator=generator), torch.randn(5, 3, generator=generator)
        nn.functional.mse_loss(reference(x), y).backward()
        nn.functional.mse_loss(model(x), y).backward()
        local = _grads(model)
        sizes = []
        with tap_collectives(all_reduce=sizes):
            fn(model, bucket_bytes)
        runs.append(
            {
                "bucket_bytes": bucket_bytes,
                "names": [n for n, _ in model.named_parameters()],
                "ddp": _grads(reference.module),
                "local": local,
                "got": _grads(model),
                "all_reduce_bytes": sizes,
            }
        )
    return runs


def _offset_hint(name: str, got: torch.Tensor, run: dict, i: int) -> str | None:
    """Where ``got`` sits in DDP's gradients laid end to end in parameter order, when that is
    not where parameter ``i``'s gradient lies: a slicing mistake; None if it is nowhere."""
    flat = torch.cat([g.reshape(-1) for g in run["ddp"]])
    own = sum(g.numel() for g in run["ddp"][:i])
    n = got.numel()
    for start in range(flat.numel() - n + 1):
        if start != own and torch.allclose(flat[start : start + n], got.reshape(-1), rtol=1e-5, atol=1e-7):
            return (
                f"the gradient of '{name}' holds the averaged values at elements {start} to "
                f"{start + n - 1} of all gradients laid end to end in parameter order, but its own are "
                f"at {own} to {own + n - 1}: the slice copied back from the bucket is off by "
                f"{start - own}; keep each parameter's offset in its bucket and copy back that slice"
            )
    return None


def _gradient_problem(where: str, name: str, i: int, run: dict, world: int) -> str | None:
    """What is wrong with parameter ``i``'s gradient on one rank, or None if it is DDP's."""
    got, ddp, local = run["got"][i], run["ddp"][i], run["local"][i]
    if got is None:
        return f"{where}: '{name}'.grad is None afterwards: write the average into p.grad"
    if close(got, ddp, rtol=1e-4, atol=1e-6):
        return None
    if got.shape != ddp.shape:
        return (
            f"{where}: '{name}'.grad has shape {list(got.shape)}, the parameter "
            f"{list(ddp.shape)}: view each bucket slice as its parameter (view_as(p))"
        )
    if close(got, local):
        return (
            f"{where}: the gradient of '{name}' is still this rank's own gradient, not the "
            "average over the ranks: its bucket was never all-reduced (is the last bucket "
            "sent too?), or, with async_op=True, copied back before work.wait() returned"
        )
    k = ratio(got, ddp)
    if k is not None and abs(k - world) < 1e-3:
        return (
            f"{where}: the gradient of '{name}' is {world} times DDP's: the bucket was summed "
            f"but not divided by the world size. DDP averages: divide by {world} (before or "
            "after the all-reduce, once)"
        )
    if k is not None and abs(k * world - 1) < 1e-3:
        return (
            f"{where}: the gradient of '{name}' is 1/{world} of DDP's: did you divide by "
            "the world size twice (before and after the all-reduce)?"
        )
    if k is not None:
        return f"{where}: the gradient of '{name}' is {k:g} times DDP's"
    hint = _offset_hint(name, got, run, i)
    if hint:
        return f"{where}: {hint}"
    return (
        f"{where}: the gradient of '{name}' differs from DDP's (largest difference "
        f"{(got - ddp).abs().max().item():.3g})"
    )


def _bucket_problem(run: dict, bucket_bytes: int) -> str | None:
    """What is wrong with the all-reduces one rank made (their bytes), or None."""
    sizes = [g.numel() * g.element_size() for g in run["ddp"]]
    sent = run["all_reduce_bytes"]
    fewest = _fewest_buckets(sizes, bucket_bytes)
    if not sent:
        return (
            f"with bucket_bytes={bucket_bytes}: the gradients are right, but no dist.all_reduce "
            "was seen: call it as dist.all_reduce(...) (torch.distributed's own function), one per bucket"
        )
    too_big = [b for b in sent if b > bucket_bytes and b not in sizes]
    if too_big:
        return (
            f"with bucket_bytes={bucket_bytes}: one all-reduce sent {too_big[0]} bytes, more than "
            f"bucket_bytes: close a bucket before it would pass {bucket_bytes} bytes (a gradient "
            "larger than that travels alone)"
        )
    if len(sent) > fewest and sorted(sent) == sorted(sizes):
        return (
            f"with bucket_bytes={bucket_bytes}: the gradients are right, but they went in "
            f"{len(sent)} all-reduces, one per parameter ({sent} bytes); buckets of up to "
            f"{bucket_bytes} bytes need only {fewest}: flatten several gradients into one buffer "
            "(torch.cat of their .view(-1)) and all-reduce it once"
        )
    if len(sent) > len(sizes):
        return (
            f"with bucket_bytes={bucket_bytes}: {len(sent)} all-reduces for {len(sizes)} gradients: "
            "each bucket should be all-reduced once"
        )
    return None


def _diagnose(outcomes) -> str | None:
    world = len(outcomes)
    for run_index, bucket_bytes in enumerate(BUCKET_BYTES):
        for o in outcomes:
            run = o.data[run_index]
            where = f"with bucket_bytes={bucket_bytes}, rank {o.rank}"
            for i, name in enumerate(run["names"]):
                problem = _gradient_problem(where, name, i, run, world)
                if problem:
                    return problem
        problem = _bucket_problem(outcomes[0].data[run_index], bucket_bytes)
        if problem:
            return problem
    return None


def _fewest_buckets(sizes: list[int], cap: int) -> int:
    """Buckets that gradients of ``sizes`` bytes need, filled greedily in order up to ``cap``."""
    count, held = 0, None
    for size in sizes:
        if held is None or held + size > cap:
            count, held = count + 1, size
        else:
            held += size
    return count


def _result(outcomes) -> CheckResult:
    result = CheckResult(
        "bucketed_gradient_sync",
        f"leaves DDP's averaged gradients on both of {WORLD_SIZE} ranks (a Linear(4, 8), ReLU, "
        f"Linear(8, 3) model, one batch per rank), with one all-reduce per bucket of at most "
        f"{' and '.join(map(str, BUCKET_BYTES))} bytes",
    )
    problem = first_error(outcomes, "bucketed_gradient_sync") or _diagnose(outcomes)
    result.note(problem)
    return result


def check_bucketed_gradient_sync_many(fns: list, wait_s: float = 5.0) -> list[CheckResult]:
    """``check_bucketed_gradient_sync`` for several functions in one launch (nothing printed)."""
    return [_result(o) for o in run_candidates(_body, fns, world_size=WORLD_SIZE, wait_s=wait_s)]


def check_bucketed_gradient_sync(fn, wait_s: float = 5.0) -> CheckResult:
    """Run ``fn(model, bucket_bytes)`` after backward on 2 gloo ranks against torch's DDP; print
    what differs, or one line saying it passed."""
    return check_bucketed_gradient_sync_many([fn], wait_s)[0].shown()
