"""Exercise: a DataParallel step by hand, checked against the same batch on one device.

The learner writes ``data_parallel_loss(model, inputs, targets, devices)``: split the batch
``inputs [B, 4]`` by rows over ``devices`` (``torch.chunk``'s split, as ``nn.DataParallel``
scatters), run one replica of ``model`` per chunk, replicas that stay connected to ``model``'s
parameters through autograd, gather the outputs on ``devices[0]`` in chunk order and return the
mean squared error against ``targets [B, 3]`` over the whole batch. ``backward()`` on it must
leave in ``model``'s ``.grad`` what one device computes: the point of chapter 03's section 3.

``check_data_parallel_loss(fn)`` runs it on CPU stand-ins for the devices (one process, as
DataParallel is) for batches of 6 rows on 2 devices, 5 on 2 (chunks of 3 and 2) and 5 on 3 (2, 2,
1), and compares the loss and the gradients with ``F.mse_loss(model(inputs), targets)`` on one
device.

Taught in chapter 03 (sections 2 and 3, the four steps by hand and the same numbers as one device).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from course_utils.exercises.result import CheckResult, close, ratio

__all__ = ["check_data_parallel_loss", "check_data_parallel_loss_many", "CASES"]

CASES = ((6, 2), (5, 2), (5, 3))  # (rows in the batch, devices)


def _setup(rows: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, torch.randn(rows, 4), torch.randn(rows, 3)


def _one_device(rows: int) -> tuple[float, list[torch.Tensor]]:
    model, inputs, targets = _setup(rows)
    loss = F.mse_loss(model(inputs), targets)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def _loss_problem(where: str, got: float, rows: int, n: int) -> str | None:
    """Name the mistake whose loss is ``got``, if it is one the checker knows."""
    model, inputs, targets = _setup(rows)
    with torch.no_grad():
        outs = [model(c) for c in inputs.chunk(n)]
        parts = [F.mse_loss(o, t) for o, t in zip(outs, targets.chunk(n), strict=True)]
        sizes = " + ".join(str(len(o)) for o in outs)
        known = [
            (
                sum(parts),
                "each chunk's mean loss was added up: the mean over the batch is the sum of the squared "
                "errors over all rows, divided once by their number (gather the outputs, one loss)",
            ),
            (
                sum(parts) / len(parts),
                f"each chunk's mean loss counts equally, but the batch of {rows} rows splits {sizes}: a "
                "row of a smaller chunk weighs more. Gather the outputs and take one loss over the batch",
            ),
            (
                F.mse_loss(torch.cat(outs[::-1]), targets),
                "the outputs were gathered in another order than the chunks were scattered, so rows "
                "meet the wrong targets: gather them in chunk order (devices[0]'s chunk first)",
            ),
            (
                parts[0],
                "only the first chunk's rows count: every replica's output must be gathered",
            ),
        ]
    for value, why in known:
        if abs(float(value) - got) < 1e-5 * max(1.0, abs(got)):
            return f"{where}: the loss is {got:.5g}, not one device's: {why}"
    return None


def _case_problem(fn, rows: int, n: int) -> str | None:
    where = f"{rows} rows on {n} devices"
    want_loss, want_grads = _one_device(rows)
    model, inputs, targets = _setup(rows)
    devices = [torch.device("cpu")] * n
    try:
        loss = fn(model, inputs, targets, devices)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return (
                f"{where}: data_parallel_loss returned {type(loss).__name__}, not a one-element loss tensor"
            )
        if not loss.requires_grad:
            return (
                f"{where}: the loss has no autograd history (computed under no_grad, or from detached "
                "outputs): backward() could not reach the model's parameters"
            )
        loss.backward()
    except Exception as exc:
        return f"{where}: your function raised {type(exc).__name__}: {str(exc)[:200]}"
    got = loss.item()
    if abs(got - want_loss) > 1e-5 * max(1.0, abs(want_loss)):
        return _loss_problem(where, got, rows, n) or (
            f"{where}: the loss is {got:.5g}, one device gives {want_loss:.5g}"
        )
    for (name, p), want in zip(model.named_parameters(), want_grads, strict=True):
        if p.grad is None or not p.grad.abs().sum():
            return (
                f"{where}: the loss is right, but '{name}' has no gradient after backward(): the replicas "
                "are not connected to the model's parameters (copy.deepcopy makes new leaf tensors). "
                "Make each replica's parameters from the model's with operations autograd records "
                "(p.to(device) is one; copy.deepcopy is not)"
            )
        if not close(p.grad, want, rtol=1e-4, atol=1e-6):
            k = ratio(p.grad, want)
            times = f" ({k:g} times one device's)" if k is not None else ""
            return f"{where}: the loss is right but the gradient of '{name}' differs from one device's{times}"
    return None


def _check(fn) -> CheckResult:
    result = CheckResult(
        "data_parallel_loss",
        "gives one device's loss and gradients for "
        + ", ".join(f"{rows} rows on {n} devices" for rows, n in CASES),
    )
    for rows, n in CASES:
        problem = _case_problem(fn, rows, n)
        if problem:
            result.problems.append(problem)
            break
    return result


def check_data_parallel_loss_many(fns: list) -> list[CheckResult]:
    """``check_data_parallel_loss`` for several functions (nothing printed)."""
    return [_check(fn) for fn in fns]


def check_data_parallel_loss(fn) -> CheckResult:
    """Compare ``fn(model, inputs, targets, devices)`` with one device's loss and gradients;
    print what differs, or one line saying it passed."""
    return _check(fn).shown()
