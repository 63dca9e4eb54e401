"""All-reduce by hand: a ring of point-to-point messages (reduce-scatter, then all-gather).

The ``w`` ranks of a group stand in a ring; each only ever talks to its right
neighbour (sends) and its left neighbour (receives). The flat tensor is cut into
``w`` chunks. Two phases of ``w - 1`` steps each:

1. **reduce-scatter**: at step ``s`` rank ``r`` sends chunk ``(r - s) % w`` to the
   right and receives chunk ``(r - s - 1) % w`` from the left, which it adds into
   its own copy. After ``w - 1`` steps rank ``r`` holds the full sum of chunk
   ``(r + 1) % w``.
2. **all-gather**: at step ``s`` rank ``r`` sends chunk ``(r + 1 - s) % w`` (a
   finished sum) and receives chunk ``(r - s) % w``, which overwrites its own.

Each rank sends ``2 (w - 1) / w`` of the tensor in all, whatever ``w`` is: the
least any all-reduce can send, which is why NCCL and gloo use rings too.

Every send is posted together with the receive it pairs with, as one
``dist.batch_isend_irecv`` of two ``dist.P2POp`` (as Megatron-LM and
``torch.distributed.pipelining`` do). On NCCL, a send and a receive posted one
by one can wait for each other forever: with 2 ranks the right and the left
neighbour are the same process, and both directions share one NCCL stream. A
batch starts its send and its receive as one operation. Gloo just posts them.

Taught in chapter 02 (appendix 02b, section 1, all-reduce by hand: the ring; the tuned ring in
appendix 02a, section 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_DTYPES_WITHOUT_SUM = (torch.bool,)


def ring_schedule(rank: int, world_size: int) -> list[tuple[str, int, int, int]]:
    """The ring's steps for one rank: ``(phase, step, chunk sent, chunk received)``.

    ``phase`` is ``"reduce-scatter"`` (the received chunk is added) or
    ``"all-gather"`` (the received chunk is copied); ``2 (w - 1)`` steps in all.
    """
    w, r = world_size, rank
    return [("reduce-scatter", s, (r - s) % w, (r - s - 1) % w) for s in range(w - 1)] + [
        ("all-gather", s, (r + 1 - s) % w, (r - s) % w) for s in range(w - 1)
    ]


def bytes_sent_per_rank(numel: int, element_size: int, world_size: int, rank: int = 0) -> int:
    """Bytes that ``rank`` sends in ``ring_all_reduce`` of a ``numel``-element tensor.

    The sum of the chunks it sends at its ``2 (w - 1)`` steps: ``2 (w - 1) / w`` of the
    tensor when ``w`` divides ``numel`` (a 64 MB tensor on 4 ranks: 96 MB per rank).
    """
    base, extra = divmod(numel, world_size)  # torch.tensor_split: the first `extra` chunks get one more
    size = [base + (1 if i < extra else 0) for i in range(world_size)]
    return element_size * sum(size[sent] for _, _, sent, _ in ring_schedule(rank, world_size))


def _check(tensor, group) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ring_all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype in _DTYPES_WITHOUT_SUM or tensor.is_complex():
        raise TypeError(
            f"ring_all_reduce sums tensors; dtype {tensor.dtype} is not supported "
            "(use a float or integer dtype)"
        )
    if not dist.is_initialized():
        raise RuntimeError(
            "ring_all_reduce needs an initialised process group: call it inside "
            "a function run by launch(...) or torchrun, after init_process_group"
        )
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError(
            f"rank {dist.get_rank()} is not a member of the group passed to "
            "ring_all_reduce; call it only on the ranks the group contains"
        )


def _global_rank(group, group_rank: int) -> int:
    """P2POp's ``peer`` is a global rank; a subgroup numbers its members 0..w-1."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _pieces(chunk: torch.Tensor, segment: int) -> tuple:
    """A chunk cut into segments of at most ``segment`` elements (none if it is empty)."""
    return torch.split(chunk, segment) if chunk.numel() else ()


def _exchange(outgoing, incoming, right, left, group, tag) -> list:
    """Post a send of ``outgoing`` to ``right`` and a receive into ``incoming`` from ``left``
    as one batch; either may be None (nothing to send or receive). Returns the works to wait on."""
    ops = []
    if outgoing is not None:
        ops.append(dist.P2POp(dist.isend, outgoing, right, group=group, tag=tag))
    if incoming is not None:
        ops.append(dist.P2POp(dist.irecv, incoming, left, group=group, tag=tag))
    return dist.batch_isend_irecv(ops) if ops else []


def send_and_add(outgoing, incoming, scratch, right, left, group, first_tag) -> None:
    """One reduce-scatter step: send ``outgoing`` right, adding what comes from the left into ``incoming``.

    Both arrive as lists of segments (1-D views of at most ``segment`` elements;
    the two chunks differ by at most one element, so the lists by at most one
    segment). Segment k's send and receive form batch k. Two scratch buffers
    take turns: batch k + 1 is posted before segment k is added, so the next
    segment is already travelling while this one is being added.
    """

    def post(k):  # batch k: send segment k right, receive segment k from the left into a scratch buffer
        send = outgoing[k] if k < len(outgoing) else None
        receive = scratch[k % 2][: incoming[k].numel()] if k < len(incoming) else None
        return _exchange(send, receive, right, left, group, first_tag + k)

    n = max(len(outgoing), len(incoming))
    batches = [post(0)] if n else []
    for k in range(n):
        if k + 1 < n:
            batches.append(post(k + 1))  # into the buffer that segment k - 1 has left
        for work in batches[k]:
            work.wait()
        if k < len(incoming):
            incoming[k].add_(scratch[k % 2][: incoming[k].numel()])


def _send_and_copy(outgoing, incoming, right, left, group, tag) -> None:
    """One all-gather step: send a finished chunk right, receive one from the left in place.
    An empty chunk is neither sent nor received (the neighbour skips the same one)."""
    for work in _exchange(
        outgoing if outgoing.numel() else None,
        incoming if incoming.numel() else None,
        right,
        left,
        group,
        tag,
    ):
        work.wait()


def plain_ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """The ring in its plainest form: sum a contiguous ``tensor`` (any shape) over ``group``, in place.

    ``2 (w - 1)`` steps (``ring_schedule``); at each, one chunk (``numel / w``
    elements) goes to the right neighbour while one arrives from the left, the pair
    posted together. Reduce-scatter adds what arrives, all-gather copies it.
    ``ring_all_reduce`` is the same ring, tuned (segments, reused buffers).
    """
    _check(tensor, group)
    w, r = dist.get_world_size(group), dist.get_rank(group)
    chunks = torch.tensor_split(tensor.view(-1), w)  # w views of the flat tensor
    right, left = _global_rank(group, (r + 1) % w), _global_rank(group, (r - 1) % w)
    for phase, _, send_i, recv_i in ring_schedule(r, w):
        incoming = torch.empty_like(chunks[recv_i])
        pair = [
            dist.P2POp(dist.isend, chunks[send_i], right, group),
            dist.P2POp(dist.irecv, incoming, left, group),
        ]
        for work in dist.batch_isend_irecv(pair):  # send and receive posted as one
            work.wait()
        if phase == "reduce-scatter":
            chunks[recv_i].add_(incoming)
        else:
            chunks[recv_i].copy_(incoming)
    return tensor


def ring_all_reduce(tensor: torch.Tensor, group=None, segment_bytes: int = 1 << 20) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group`` in place, by hand; same result as ``dist.all_reduce``.

    tensor: any shape, any float or integer dtype, the same shape and dtype on
    every rank of ``group`` (the default group when None). Lengths that ``w``
    does not divide, or smaller than ``w``, are fine: chunks differ by at most
    one element, and empty chunks are simply not sent. Returns ``tensor``.

    In the reduce-scatter phase each chunk travels in segments of at most
    ``segment_bytes``, received into two small buffers that take turns (as
    gloo does): adding one segment overlaps with receiving the next, and no
    chunk-sized scratch memory is needed. Each send is posted with its paired
    receive in one ``batch_isend_irecv`` (safe on NCCL, see the module docstring).
    """
    # details: check the arguments; nothing to do for one rank or an empty tensor
    _check(tensor, group)
    if segment_bytes < tensor.element_size():
        raise ValueError(
            f"segment_bytes must hold at least one element ({tensor.element_size()} "
            f"bytes for {tensor.dtype}), got {segment_bytes}"
        )
    w, r = dist.get_world_size(group), dist.get_rank(group)
    if w == 1 or tensor.numel() == 0:
        return tensor
    # end details
    data = tensor if tensor.is_contiguous() else tensor.contiguous()
    chunks = torch.tensor_split(data.view(-1), w)  # views, no copy; sizes differ by <= 1
    right, left = _global_rank(group, (r + 1) % w), _global_rank(group, (r - 1) % w)
    # details: two scratch buffers of one segment each, and message tags every rank agrees on
    segment = segment_bytes // tensor.element_size()
    scratch = [
        torch.empty(min(segment, chunks[0].numel()), dtype=tensor.dtype, device=tensor.device)
        for _ in range(2)
    ]
    tags_per_step = -(-chunks[0].numel() // segment)  # every rank agrees: chunk 0 is the largest
    # end details

    for phase, step, send_i, recv_i in ring_schedule(r, w):
        if phase == "reduce-scatter":
            send_and_add(
                _pieces(chunks[send_i], segment),
                _pieces(chunks[recv_i], segment),
                scratch,
                right,
                left,
                group,
                first_tag=step * tags_per_step,
            )
        else:
            _send_and_copy(
                chunks[send_i], chunks[recv_i], right, left, group, tag=(w - 1) * tags_per_step + step
            )
    if data is not tensor:
        tensor.copy_(data)
    return tensor
