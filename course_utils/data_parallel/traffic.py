"""Who sends how many bytes in one data-parallel training step: DataParallel by copies, DataParallel
with NCCL, and DDP's ring all-reduce. The three send the same total and differ in who sends it.

Taught in chapter 03 (appendix 03a, section 3, the traffic table).
"""

from __future__ import annotations

__all__ = ["SCHEMES", "bytes_sent_per_step"]

SCHEMES = ("copies", "nccl", "ring")


def bytes_sent_per_step(param_bytes: int, world_size: int, scheme: str) -> list[int]:
    """Bytes each of ``world_size`` devices *sends* in one training step, for ``param_bytes``
    of parameters (and as many bytes of gradients); index ``i`` is device ``i``.

    ``"copies"``: DataParallel moving tensors by plain copies (our by-hand version, and
        ``torch.nn.parallel.comm`` without NCCL): device 0 sends the weights to each other
        device; each other device sends its gradients to device 0.
    ``"nccl"``: DataParallel with NCCL (``comm.broadcast_coalesced`` then
        ``comm.reduce_add``): NCCL pipelines a broadcast and a reduce along a chain
        0 -> 1 -> ... -> w-1: every device but the last forwards the weights once, every
        device but device 0 sends gradients once.
    ``"ring"``: DDP's ring all-reduce of the gradients: each device sends
        ``2 (w - 1) / w`` of them, weights never travel.
    All three send ``2 (w - 1) x param_bytes`` in total; they differ in who sends it.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if world_size < 1 or param_bytes < 0:
        raise ValueError(f"need world_size >= 1 and param_bytes >= 0, got {world_size} and {param_bytes}")
    w, p = world_size, param_bytes
    if w == 1:
        return [0]
    if scheme == "copies":
        return [(w - 1) * p] + [p] * (w - 1)
    if scheme == "nccl":
        return [p * (i < w - 1) + p * (i > 0) for i in range(w)]
    return [2 * (w - 1) * p // w] * w
