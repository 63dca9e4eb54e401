"""1F1B written out by hand: one training step of one stage, sends and receives in line.

Each rank holds one stage (``stage``, an ``nn.Module``) of one pipeline, whose ranks in
stage order are ``ranks`` (e.g. ``[0, 1]``). A step runs the 1F1B order of
``schedules.one_f_one_b_order``: ``p-1-s`` warm-up forwards on stage ``s``, then one
forward and one backward at a time, then the remaining backwards (the cool-down). When
the last backward is done, no micro-batch is left in the pipeline (the *flush*) and every
parameter's ``.grad`` holds the gradient of the whole batch: only then does the
optimizer step, so every micro-batch of the step saw the same weights.

Every message is posted together with the message it meets on the other side, as one
``dist.batch_isend_irecv`` (``exchange``): in the steady phase a stage sends its output
forward while receiving, from the same neighbour, the gradient of an earlier output, and
sends its input gradient back while receiving the next input. The neighbour posts the
mirror pair at the same point of its own loop, so no send ever waits for a receive that
is posted later (on NCCL a send may wait for its receiver: NCCL runs the operations of
one ``ncclGroupStart``/``ncclGroupEnd`` group, which ``batch_isend_irecv`` is, as if
concurrently, and two lone crossing sends only finish if the transport buffers them).
This is the pairing of Megatron-LM's 1F1B (``send_forward_recv_backward``,
``send_backward_recv_forward``). Activations and their gradients have the targets' shape
``[b, width]``.

``copies``: with data parallelism across pipeline copies (chapter 06, section 10), the
process group of this stage's copies; after the flush their gradients are averaged
(``all_reduce``) before the optimizer step.

Taught in chapter 06 (section 9, a plain 1F1B loop on real processes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_utils.pipeline.mlp import loss_fn
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.timing import Stopwatch

__all__ = ["exchange", "exchange_ms", "train_step_1f1b"]


def exchange(send=None, to: int | None = None, recv_from: int | None = None, like=None):
    """Post a send (of ``send`` to rank ``to``) and a receive (from rank ``recv_from``, into
    a new tensor shaped ``like``) as one batch, wait for both, return what arrived (or None).
    A missing peer (None: no stage there) leaves that half out."""
    ops, received = [], None
    if send is not None and to is not None:
        ops.append(dist.P2POp(dist.isend, send, to))
    if recv_from is not None:
        received = torch.empty_like(like)
        ops.append(dist.P2POp(dist.irecv, received, recv_from))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return received


def train_step_1f1b(stage: nn.Module, optimizer, xs, ys, ranks: list[int], copies=None) -> float | None:
    """One 1F1B training step of this rank's ``stage`` over the micro-batches ``xs``, ``ys``
    (each ``[b, width]``; only the first stage reads ``xs``, only the last ``ys``), then the
    optimizer step. Returns the last stage's loss (the sum of each micro-batch's share), else None."""
    s, p, m = ranks.index(dist.get_rank()), len(ranks), len(ys)
    prev = ranks[s - 1] if s > 0 else None  # None: no stage before (first) or after (last)
    nxt = ranks[s + 1] if s < p - 1 else None
    in_flight, losses = [], []  # (input, output or loss) of each micro-batch between its F and B

    def forward(j, x):  # F(s, j): returns the activation to send on
        x = xs[j] if prev is None else x.requires_grad_()
        out = stage(x)
        if nxt is None:  # last stage: this micro-batch's share of the batch's mean loss
            out = loss_fn(out, ys[j]) / m
            losses.append(out.item())
        in_flight.append((x, out))
        return None if nxt is None else out.detach()

    def backward(grad):  # B(s, oldest micro-batch in flight): returns the input gradient
        x, out = in_flight.pop(0)
        torch.autograd.backward(out, grad)
        return None if prev is None else x.grad

    optimizer.zero_grad(set_to_none=True)
    warmup = min(p - 1 - s, m)
    for j in range(warmup):  # warm-up: forwards only
        exchange(forward(j, exchange(recv_from=prev, like=ys[j])), to=nxt)
    x = exchange(recv_from=prev, like=ys[0]) if warmup < m else None
    for i in range(m - warmup):  # steady: F(s, warmup + i), then B(s, i)
        grad = exchange(forward(warmup + i, x), to=nxt, recv_from=nxt, like=ys[0])
        last = i == m - warmup - 1
        x = exchange(backward(grad), to=prev, recv_from=None if last else prev, like=ys[0])
    for _ in range(warmup):  # cool-down: the remaining backwards
        exchange(backward(exchange(recv_from=nxt, like=ys[0])), to=prev)
    # the flush: no micro-batch left in the pipeline, .grad holds the whole batch's gradient
    if copies is not None:  # pipeline copies on other rows of the batch: average their gradients
        for param in stage.parameters():
            dist.all_reduce(param.grad, group=copies)
            param.grad /= dist.get_world_size(copies)
    optimizer.step()
    return sum(losses) if losses else None


def exchange_ms(like: torch.Tensor, repeats: int = 20) -> float:
    """On 2 ranks (under ``launch``): the milliseconds of one ``exchange`` with the other rank,
    ``like`` [any shape] sent and a tensor of its shape received, the ranks in step; the fastest
    of ``repeats``, the message's own cost, which other programs on the machine can only add to.
    The message goes from the rank's device (``rank_device()``: its GPU under NCCL)."""
    device = rank_device()
    like, peer, times = like.to(device), 1 - dist.get_rank(), []
    for _ in range(repeats):
        dist.barrier()
        with Stopwatch(device) as watch:  # on a GPU, until the message has arrived, not only been queued
            exchange(like, to=peer, recv_from=peer, like=like)
        times.append(watch.seconds * 1e3)
    return min(times)
