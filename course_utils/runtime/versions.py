"""What differs between the torch versions the course supports (2.9.1, the floor, to 2.13), with
public APIs only; the private APIs the course needs are in ``compat.py``.

Each helper names the torch that lacks something and gives the same result on every version:

* ``all_to_all(outs, ins)``: ``dist.all_to_all``, or, where the backend has no list-form
  all-to-all (gloo in torch 2.9; gloo has it in 2.13, see pytorch/pytorch#165435), the same
  exchange made of paired point-to-point messages (``all_to_all_by_pairs``).
  ``dist.all_to_all_single`` (one flat tensor) works on gloo in every supported torch.
* ``fix_init_handshake(ops)``: torch 2.9's ``PipelineStage`` opens its connections by sending
  an int64 scalar (8 bytes) into a float32 receive buffer (4 bytes); gloo checks sizes and
  aborts the process (SIGABRT). torch 2.13 sends float32. The course's stages send float32.
* ``step_accepts_return_outputs(schedule)``: ``schedule.step(return_outputs=...)`` is new
  after torch 2.9; there, an unknown keyword would be passed on to the model's forward.
* ``reusable_stager(options)``: a ``DefaultStager`` kept from one ``dcp.async_save`` to the
  next, where this torch's can be reused. torch 2.11's ``DefaultStager`` clears its copier's
  dispatch table after every staging, so its second staging fails (``KeyError: <class 'type'>``
  in ``deepcopy_with_tensor_offload``); torch 2.9 and 2.13 keep it. Found by a probe, not by
  version number.
* ``quiet_dcp_storage_warning()``: torch 2.9's DCP file writer calls ``tensor.storage()``, which
  warns "TypedStorage is deprecated" on every save; later releases do not.

Not taught in a chapter: support code that the taught modules call, so they read the same on every torch.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

__all__ = [
    "all_to_all",
    "all_to_all_by_pairs",
    "fix_init_handshake",
    "quiet_dcp_storage_warning",
    "reusable_stager",
    "step_accepts_return_outputs",
]

# (backend name, device type) pairs seen to lack the list form of all-to-all in this process.
# The check is local to each process (the backend refuses the call before sending anything),
# so every rank of a group reaches the same answer and takes the same path, cached or not.
_LACK_ALL_TO_ALL: set[tuple[str, str]] = set()


def all_to_all_by_pairs(outs: list[torch.Tensor], ins: list[torch.Tensor], group=None) -> None:
    """``dist.all_to_all(outs, ins)`` made of point-to-point messages: ``ins[j]`` goes to rank ``j``,
    ``outs[j]`` receives what rank ``j`` sent here.

    To each other rank, one send and one receive, all posted together in one
    ``dist.batch_isend_irecv`` and then waited for: posted one by one, a blocking send can
    wait for a receive its peer has not posted yet (NCCL deadlocks). The piece a rank sends
    itself is copied. Same bytes on the wire as the collective: ``ins[j]`` for every ``j != rank``.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if len(outs) != world or len(ins) != world:
        raise ValueError(
            f"all_to_all needs one input and one output per rank ({world}), "
            f"got {len(ins)} inputs and {len(outs)} outputs"
        )
    outs[rank].copy_(ins[rank])
    ops = []
    for peer in range(world):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, ins[peer].contiguous(), group=group, group_peer=peer))
            ops.append(dist.P2POp(dist.irecv, outs[peer], group=group, group_peer=peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()


def all_to_all(outs: list[torch.Tensor], ins: list[torch.Tensor], group=None) -> None:
    """``dist.all_to_all(outs, ins, group)``; where the backend lacks it (gloo in torch 2.9),
    ``all_to_all_by_pairs``, which gives the same result. (gloo's, where it exists, wants
    pieces of one size; the pairs take any.)

    The rule: try the collective; if the backend refuses it ("does not support alltoall",
    raised in this process before anything is sent), remember that for this backend and
    device type, and use the pairs from then on.
    """
    backend = (str(dist.get_backend(group)), ins[0].device.type)  # "cpu:gloo,cuda:nccl": per device
    if backend not in _LACK_ALL_TO_ALL:
        try:
            dist.all_to_all(outs, ins, group=group)
            return
        except RuntimeError as exc:
            if "does not support alltoall" not in str(exc):
                raise
            _LACK_ALL_TO_ALL.add(backend)
    all_to_all_by_pairs(outs, ins, group)


def fix_init_handshake(ops: list) -> list:
    """The ``PipelineStage`` connection handshake ops with every tensor float32 (one element).

    torch 2.9 sends ``torch.tensor(stage_index)`` (int64, 8 bytes) to a neighbour that
    receives into ``torch.zeros(1)`` (float32, 4 bytes); gloo aborts the process on the
    mismatch ("Received data size doesn't match expected size"). torch 2.13 sends float32,
    so there this changes nothing.
    """
    for op in ops:
        if op.tensor.dtype != torch.float32:
            op.tensor = op.tensor.to(torch.float32)
    return ops


def step_accepts_return_outputs(schedule) -> bool:
    """Whether ``schedule.step`` takes ``return_outputs`` (torch 2.9 does not)."""
    return "return_outputs" in inspect.signature(schedule.step).parameters


def reusable_stager(options):
    """A ``DefaultStager(options)`` that stages more than once, or None: where this torch has no
    ``DefaultStager`` (``dcp.async_save`` then makes its own), or where its stager works only
    once (torch 2.11: ``DefaultStager._stage`` ends by closing its ``StateDictStager``, which
    empties the copier's dispatch table). The probe stages a one-element state twice."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager
    except ImportError:
        return None
    stager = DefaultStager(options)
    try:
        for _ in range(2):
            stager.stage({"probe": torch.zeros(1), "step": 0})
    except Exception:  # a single-use stager: KeyError on torch 2.11
        stager.close()
        return None
    return stager


def quiet_dcp_storage_warning() -> None:
    """In this process, leave out the "TypedStorage is deprecated" warning that torch 2.9's
    ``dcp.save`` and ``dcp.async_save`` raise from inside their file writer (not the caller's
    doing; later releases call ``untyped_storage()``). Other warnings stay."""
    import warnings

    warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
