"""All-to-all and all-gather when every rank holds a different number of elements.

A recommendation model's sparse features are the usual case: rank r looks up ids whose embedding
rows live on other ranks, and how many ids go to each rank changes every batch. Two collectives
do it:

1. the *counts* first: each rank sends one number to every rank (how many elements it will send
   there), with ``dist.all_to_all_single`` on a ``[w]`` tensor; now every rank knows how many it
   will receive from each;
2. the *values*: ``dist.all_to_all_single(out, inp, output_split_sizes, input_split_sizes)``,
   where ``inp`` is grouped by destination rank and ``out`` comes back grouped by source rank.

Both work on gloo (CPU) in every supported torch and on NCCL (the tensors on the rank's GPU).
``all_gather_uneven`` is the same idea for all-gather, whose tensors must all have one size:
gather the sizes, pad to the largest, gather, cut the padding off.

Taught in chapter 02 (section 4, uneven all-to-all and all-gather).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["exchange_counts", "all_to_all_uneven", "all_gather_uneven"]


def exchange_counts(send_counts: list[int], device: torch.device, group=None) -> list[int]:
    """``send_counts[j]``: how many elements this rank sends to rank ``j`` (``w`` numbers).
    Returns ``recv_counts``: ``recv_counts[j]`` is how many rank ``j`` sends here."""
    w = dist.get_world_size(group)
    if len(send_counts) != w:
        raise ValueError(f"send_counts needs one count per rank ({w}), got {len(send_counts)}")
    sent = torch.tensor(send_counts, dtype=torch.int64, device=device)  # [w]
    received = torch.empty_like(sent)  # [w]
    dist.all_to_all_single(received, sent, group=group)  # one number to each rank, one from each
    return received.tolist()


def all_to_all_uneven(
    values: torch.Tensor, send_counts: list[int], group=None
) -> tuple[torch.Tensor, list[int]]:
    """Send ``values[start_j : start_j + send_counts[j]]`` to rank ``j``, for every ``j``.

    values: ``[sum(send_counts), ...]``, rows grouped by destination rank (rank 0's first).
    Returns ``(received, recv_counts)``: ``received`` is ``[sum(recv_counts), ...]``, rows grouped
    by source rank, ``recv_counts[j]`` rows from rank ``j``.
    """
    if values.shape[0] != sum(send_counts):
        raise ValueError(f"values has {values.shape[0]} rows, send_counts adds up to {sum(send_counts)}")
    recv_counts = exchange_counts(send_counts, values.device, group)
    received = values.new_empty((sum(recv_counts), *values.shape[1:]))
    dist.all_to_all_single(
        received,
        values.contiguous(),
        output_split_sizes=recv_counts,
        input_split_sizes=list(send_counts),
        group=group,
    )
    return received, recv_counts


def all_gather_uneven(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's ``t`` (``[n_r, ...]``, ``n_r`` differing between ranks, the other dimensions
    equal), in rank order: sizes gathered first, each ``t`` padded to the largest, then cut."""
    w = dist.get_world_size(group)
    size = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.empty_like(size) for _ in range(w)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s.item()) for s in sizes]
    padded = t.new_zeros((max(counts), *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(w)]
    dist.all_gather(parts, padded, group=group)
    return [part[:n] for part, n in zip(parts, counts, strict=True)]
