"""The bytes a process hands to ``torch.distributed``'s collectives, counted without changing the calls.

    sizes = []
    with tap_collectives(all_reduce=sizes):
        ...                                  # every dist.all_reduce here appends its tensor's bytes

Taught in chapter 04 (appendix 04a: the bytes each DDP communication hook sends); appendix 07e
meters its evaluation's gathers and reductions with it too.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

__all__ = ["TAPPED", "tap_collectives"]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


#: What each tapped collective is charged: ``all_reduce`` the tensor reduced, ``all_gather`` the
#: tensors gathered (what every rank holds afterwards, its own part included).
TAPPED = {
    "all_reduce": lambda tensor, *args, **kwargs: _nbytes([tensor]),
    "all_gather": lambda tensor_list, tensor, *args, **kwargs: _nbytes(tensor_list),
}


@contextlib.contextmanager
def tap_collectives(**sizes: list):
    """Within the block, append to ``sizes[name]`` the bytes of every call of ``dist.<name>``
    (a name of ``TAPPED``) in this process; the calls themselves are unchanged, and
    ``torch.distributed`` is put back after the block, however it ends. Yields ``sizes``."""
    unknown = set(sizes) - set(TAPPED)
    if unknown:
        raise ValueError(f"tap_collectives: no tap for {sorted(unknown)}; it taps {sorted(TAPPED)}")
    originals = {name: getattr(dist, name) for name in sizes}

    def tapped(name):
        def call(*args, **kwargs):
            sizes[name].append(TAPPED[name](*args, **kwargs))
            return originals[name](*args, **kwargs)

        return call

    for name in sizes:
        setattr(dist, name, tapped(name))
    try:
        yield sizes
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
