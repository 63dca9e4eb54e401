"""Exercise: the Megatron-LM MLP's forward on ranks, checked against the same MLP unsharded.

``Z = relu(X A^T + a) B^T + b`` with ``A`` (``nn.Linear(d, h)``'s weight ``[h, d]``) split by
rows, its output features, and ``B`` (``nn.Linear(h, d_out)``'s ``[d_out, h]``) split by
columns, its input features: rank ``r`` holds ``A[r*h/w : (r+1)*h/w]``, the matching slice of
``a``, and ``B[:, r*h/w : (r+1)*h/w]``; ``b`` is whole on every rank. The learner writes
``tensor_parallel_mlp(x, first_weight, first_bias, second_weight, second_bias)``: ``x [B, d]``
the same on every rank, returns ``[B, d_out]``, the whole output, on every rank, with one
collective (``model_parallel.MegatronMLP`` is the course's version, with its backward).

``check_tensor_parallel_mlp(fn)`` runs it on 2 gloo ranks (``d=4, h=6, d_out=5``, 3 rows) and
compares every rank's output with the unsharded ``Linear, ReLU, Linear``.

Taught in chapter 05 (section 6, tensor parallelism: the Megatron-LM MLP).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_utils.exercises.ranks import first_error, run_candidates
from course_utils.exercises.result import CheckResult, close, show_values

__all__ = ["check_tensor_parallel_mlp", "check_tensor_parallel_mlp_many", "WORLD_SIZE"]

WORLD_SIZE, ROWS, D, H, D_OUT = 2, 3, 4, 6, 5


def layers() -> tuple[nn.Linear, nn.Linear, torch.Tensor]:
    """The unsharded MLP's two layers and its input ``x [ROWS, D]`` (the same on every rank)."""
    torch.manual_seed(0)
    first, second = nn.Linear(D, H), nn.Linear(H, D_OUT)
    with torch.no_grad():
        second.bias.add_(2.0)  # a bias large enough that counting it twice shows
    return first, second, torch.randn(ROWS, D)


def _shards(rank: int):
    first, second, x = layers()
    part = slice(rank * H // WORLD_SIZE, (rank + 1) * H // WORLD_SIZE)
    return (
        x,
        first.weight.detach()[part].clone(),
        first.bias.detach()[part].clone(),
        second.weight.detach()[:, part].clone(),
        second.bias.detach().clone(),
    )


def _partial(rank: int) -> torch.Tensor:
    """Rank ``rank``'s partial product, before the sum over ranks and without the bias."""
    x, w1, b1, w2, _ = _shards(rank)
    return torch.relu(x @ w1.T + b1) @ w2.T


def _body(fn) -> dict:
    with torch.no_grad():
        got = fn(*_shards(dist.get_rank()))
    return {"got": got.detach().clone() if isinstance(got, torch.Tensor) else got}


def _diagnose(outcomes) -> str | None:
    first, second, x = layers()
    with torch.no_grad():
        want = second(torch.relu(first(x)))
    bias = second.bias.detach()
    partials = [_partial(r) for r in range(WORLD_SIZE)]
    total = sum(partials)
    for o in outcomes:
        r, got = o.rank, o.data["got"]
        where = f"rank {r}"
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            hint = (
                ": did you all-gather the partial outputs? Row-parallel outputs are partial sums of the "
                "whole output: all-reduce them"
                if isinstance(got, torch.Tensor) and got.shape[-1] == D_OUT * WORLD_SIZE
                else ""
            )
            return (
                f"{where}: the output has shape {shape}, expected {list(want.shape)} "
                f"(every rank the whole output){hint}"
            )
        if close(got, want, rtol=1e-4, atol=1e-5):
            continue
        if close(got, partials[r] + bias, rtol=1e-4, atol=1e-5) or close(
            got, partials[r], rtol=1e-4, atol=1e-5
        ):
            return (
                f"{where}: the output is only this rank's partial product: each rank multiplies its "
                f"{H // WORLD_SIZE} hidden features by its columns of the second weight, which gives a "
                "partial sum of the output; all-reduce (sum) the partials over the ranks"
            )
        if close(got, total + WORLD_SIZE * bias, rtol=1e-4, atol=1e-5):
            return (
                f"{where}: the second layer's bias is counted {WORLD_SIZE} times: every rank added it "
                "before the all-reduce. Add it once, after the sum (the row-parallel layer's bias is whole "
                "on every rank)"
            )
        if close(got, total / WORLD_SIZE + bias, rtol=1e-4, atol=1e-5) or close(
            got, (total + WORLD_SIZE * bias) / WORLD_SIZE, rtol=1e-4, atol=1e-5
        ):
            return (
                f"{where}: the partial products were averaged, not summed: each is a share of the output "
                "(a sum over the hidden features), so the all-reduce sums them (op SUM, no division)"
            )
        if close(got, torch.relu(want), rtol=1e-4, atol=1e-5):
            return (
                f"{where}: the output went through a ReLU: the activation sits between the two layers "
                "(on each rank's own hidden features), not after the second"
            )
        worst = int((got - want).abs().sum(1).argmax())
        return (
            f"{where}: row {worst} of the output is {show_values(got[worst])}, "
            f"expected {show_values(want[worst])}"
        )
    return None


def _result(outcomes) -> CheckResult:
    result = CheckResult(
        "tensor_parallel_mlp",
        f"gives the unsharded Linear({D}, {H}), ReLU, Linear({H}, {D_OUT}) output on both of "
        f"{WORLD_SIZE} ranks, each holding {H // WORLD_SIZE} of the {H} hidden features",
    )
    problem = first_error(outcomes, "tensor_parallel_mlp") or _diagnose(outcomes)
    result.note(problem)
    return result


def check_tensor_parallel_mlp_many(fns: list, wait_s: float = 5.0) -> list[CheckResult]:
    """``check_tensor_parallel_mlp`` for several functions in one launch (nothing printed)."""
    return [_result(o) for o in run_candidates(_body, fns, world_size=WORLD_SIZE, wait_s=wait_s)]


def check_tensor_parallel_mlp(fn, wait_s: float = 5.0) -> CheckResult:
    """Run ``fn(x, first_weight, first_bias, second_weight, second_bias)`` on 2 gloo ranks
    against the unsharded MLP; print what differs, or one line saying it passed."""
    return check_tensor_parallel_mlp_many([fn], wait_s)[0].shown()
