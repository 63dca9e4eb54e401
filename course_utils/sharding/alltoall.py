"""The one collective every sharded lookup uses: all-to-all, differentiable and metered.

``exchange(pieces, shapes, ...)`` sends ``pieces[d]`` to rank ``d`` and returns what
each rank sent here, reshaped to ``shapes[s]`` (one call of
``dist.all_to_all_single``). When a piece needs a gradient, the backward pass is the
same all-to-all with the roles swapped: the gradient of what rank ``s`` sent us goes
back to rank ``s``.

Every call records, in a :class:`Traffic`, the bytes this rank put on the wire for
each destination, taken from the tensors it actually sent (the piece a rank keeps
for itself is not counted: it never leaves the process).

Taught in chapter 07 (section 3, the one collective: all-to-all).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["Traffic", "AllToAll", "exchange"]

PHASES = ("counts", "ids", "embeddings", "gradients")


class Traffic:
    """Bytes one rank sent to the others, per phase and per destination.

    ``to[phase][d]`` bytes sent to rank ``d`` (0 for this rank itself), for the phases
    ``counts`` (row-wise: how many ids follow), ``ids`` (forward, input ids out),
    ``embeddings`` (forward, pooled vectors back) and ``gradients`` (backward).
    """

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.rank = world_size, rank
        self.reset()

    def reset(self) -> None:
        self.to = {phase: [0] * self.world_size for phase in PHASES}

    def record(self, phase: str, nbytes_per_destination: Sequence[int]) -> None:
        for d, nbytes in enumerate(nbytes_per_destination):
            if d != self.rank:
                self.to[phase][d] += int(nbytes)

    def as_dict(self) -> dict:
        """``{phase: [bytes to rank 0, .., rank W-1]}``, plain ints (picklable, printable)."""
        return {phase: list(v) for phase, v in self.to.items()}


def _all_to_all_flat(flat: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = flat.new_empty(sum(recv))
    dist.all_to_all_single(
        out, flat.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group
    )
    return out


class AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward sends each gradient piece back where it came from."""

    @staticmethod
    def forward(ctx, flat, send, recv, group, traffic):
        ctx.send, ctx.recv, ctx.group, ctx.traffic = send, recv, group, traffic
        return _all_to_all_flat(flat, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.traffic is not None:
            ctx.traffic.record("gradients", [n * grad.element_size() for n in ctx.recv])
        return _all_to_all_flat(grad, ctx.recv, ctx.send, ctx.group), None, None, None, None


def exchange(
    pieces: Sequence[torch.Tensor],
    shapes: Sequence[tuple],
    phase: str,
    traffic: Traffic | None = None,
    group=None,
) -> list[torch.Tensor]:
    """All-to-all: send ``pieces[d]`` to rank ``d``; return the pieces received, one per source rank.

    pieces: ``world_size`` tensors of one dtype (any shapes; sent flattened).
    shapes: the shape of the piece each source rank sends here (the receiver must know it:
        from the plan, or from an earlier exchange of counts).
    phase: the :class:`Traffic` phase to book the bytes under.
    Differentiable: if a piece requires grad, the gradients travel back by the reverse all-to-all.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    world = dist.get_world_size(group)
    if len(pieces) != world or len(shapes) != world:
        raise ValueError(
            f"exchange needs one piece and one shape per rank ({world}), "
            f"got {len(pieces)} pieces and {len(shapes)} shapes"
        )
    send = [p.numel() for p in pieces]
    recv = [int(torch.Size(s).numel()) for s in shapes]
    flat = torch.cat([p.reshape(-1) for p in pieces])
    if traffic is not None:
        traffic.record(phase, [n * flat.element_size() for n in send])
    if flat.requires_grad:
        out = AllToAll.apply(flat, send, recv, group, traffic)
    else:
        out = _all_to_all_flat(flat, send, recv, group)
    return [piece.reshape(shape) for piece, shape in zip(out.split(recv), shapes, strict=False)]
