"""Mixed precision under DDP: autocast in forward, a loss scaler with ``no_sync``, clipping after the sync.

The step, as PyTorch's AMP recipe writes it, with gradient accumulation over ``k`` micro-batches:

    for micro, (x, y) in enumerate(micro_batches):
        with (model.no_sync() if micro < k - 1 else nullcontext()):   # forward AND backward inside
            with torch.autocast(device.type, dtype=dtype):             # matmuls in 16 bits
                loss = loss_fn(model(x), y) / k
            scaler.scale(loss).backward()                              # grads of loss * scale
    scaler.unscale_(optimizer)              # once per sync: the averaged grads, divided by the scale
    clip_grad_norm_(model.parameters(), max_norm)   # after the sync: the same norm on every rank
    scaler.step(optimizer); scaler.update()         # skips the step if a grad is inf/NaN
    optimizer.zero_grad()

* ``autocast`` runs the forward's matrix products in float16 or bfloat16; the parameters, their
  gradients and DDP's all-reduce stay float32 (DDP averages the float32 ``.grad``).
* ``GradScaler`` multiplies the loss so that small float16 gradients do not round to zero, and
  divides the gradients back (``unscale_``) before the step. Scaled gradients add up like any
  others, so ``scale(loss).backward()`` inside ``no_sync`` accumulates; ``unscale_`` and ``step``
  run once per optimizer step, after the synced backward. bfloat16 has float32's exponent range
  and needs no scaler; on CUDA with float16 it is what keeps training stable. (``GradScaler("cpu")``
  runs the same code on the CPU, which is how this module's CPU twin runs the recipe.)
* Clipping reads the gradient norm: after the sync every rank holds the same averaged gradient,
  so every rank computes the same norm and scales alike. Clipped before the sync (each rank its
  own gradient), the ranks would clip by different factors (``rank_agreement.clipping_norms``).

Taught in chapter 04 (appendix 04b, section 1).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_utils.ddp.overlap import tower
from course_utils.runtime.hardware import rank_device

__all__ = ["amp_dtype", "amp_step", "train_amp"]


def amp_dtype(device: torch.device) -> torch.dtype:
    """The 16-bit type autocast uses here: float16 on CUDA (with a loss scaler), bfloat16 on the CPU."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def amp_step(model, optimizer, scaler, micro_batches, dtype, max_norm: float) -> float:
    """One optimizer step over ``micro_batches`` (``[(x [B, in], y [B, 1]), ...]``), the recipe of the
    module docstring; returns the gradient norm ``clip_grad_norm_`` measured (after the sync)."""
    device = next(model.parameters()).device
    k = len(micro_batches)
    for micro, (x, y) in enumerate(micro_batches):
        with model.no_sync() if micro < k - 1 else contextlib.nullcontext():
            with torch.autocast(device.type, dtype=dtype):
                loss = nn.functional.mse_loss(model(x).float(), y) / k
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def train_amp(
    steps: int = 4, micro_batches: int = 2, rows: int = 64, width: int = 64, max_norm: float = 0.25
) -> dict:
    """On every rank (call through ``launch``): the same torch-DDP training of a small tower twice,
    in float32 and under autocast with a ``GradScaler``, ``micro_batches`` per step.

    Returns ``{"float32" | "amp": {"norms": [gradient norm per step, after the sync],
    "weights": this rank's flat parameters [n]}, "dtype": autocast's type, "scale": the scaler's
    final scale}``.
    """
    device = rank_device()
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [
        [
            (torch.randn(rows, width, generator=g).to(device), torch.randn(rows, 1, generator=g).to(device))
            for _ in range(micro_batches)
        ]
        for _ in range(steps)
    ]
    out = {"dtype": str(amp_dtype(device)).replace("torch.", "")}
    for name in ("float32", "amp"):
        model = tower(width, 4, seed=0).to(device)
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        if name == "amp":
            scaler = torch.amp.GradScaler(device.type)
            norms = [amp_step(ddp, optimizer, scaler, step, amp_dtype(device), max_norm) for step in batches]
            out["scale"] = float(scaler.get_scale())
        else:
            norms = [_float32_step(ddp, optimizer, step, max_norm) for step in batches]
        out[name] = {
            "norms": norms,
            "weights": torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]),
        }
    return out


def _float32_step(model, optimizer, micro_batches, max_norm: float) -> float:
    """The same step without autocast or scaler: the reference the mixed-precision run is compared with."""
    k = len(micro_batches)
    for micro, (x, y) in enumerate(micro_batches):
        with model.no_sync() if micro < k - 1 else contextlib.nullcontext():
            (nn.functional.mse_loss(model(x), y) / k).backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
