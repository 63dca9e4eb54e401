"""A guard that every point-to-point message is posted with its partner in one
``batch_isend_irecv`` (tests/test_collectives.py, tests/test_pipeline_*.py)."""

import contextlib

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


class LoneP2PError(AssertionError):
    pass


@contextlib.contextmanager
def only_batched_p2p():
    """Inside it, isend / irecv raise unless ``batch_isend_irecv`` calls them, send / recv always.

    Yields the list of batches posted, each a list of (op name, peer global rank). P2POp
    accepts only c10d's own ``isend`` / ``irecv`` and ``batch_isend_irecv`` calls them through
    ``P2POp.op``, so the guards replace the names in ``torch.distributed`` and in c10d alike.
    """
    names = ("isend", "irecv", "send", "recv", "batch_isend_irecv")
    originals = {name: getattr(c10d, name) for name in names}
    saved = {name: getattr(dist, name) for name in names}
    batches, inside = [], [False]

    def guard(name):
        def guarded(*args, **kwargs):
            if not inside[0] or name in ("send", "recv"):
                raise LoneP2PError(f"dist.{name} called on its own, outside batch_isend_irecv")
            return originals[name](*args, **kwargs)

        guarded.__name__ = name
        return guarded

    def batch_isend_irecv(ops):
        batches.append([(op.op.__name__, op.peer) for op in ops])
        inside[0] = True
        try:
            return originals["batch_isend_irecv"](ops)
        finally:
            inside[0] = False

    replacements = {name: guard(name) for name in names[:4]} | {"batch_isend_irecv": batch_isend_irecv}
    try:
        for name, fn in replacements.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)
        yield batches
    finally:
        for name in names:
            setattr(c10d, name, originals[name])
            setattr(dist, name, saved[name])
