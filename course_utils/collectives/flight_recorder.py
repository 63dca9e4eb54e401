"""The flight recorder: each rank's last collectives, and the first one where ranks part ways.

Every process group records each collective it is asked for (a ring buffer of
``TORCH_FR_BUFFER_SIZE`` entries, also read as ``TORCH_NCCL_TRACE_BUFFER_SIZE``): its sequence
number in the group, its name (``nccl:all_reduce``, ``gloo:broadcast``), its tensors' sizes,
and on NCCL its state (scheduled, started, completed) with times. When a job hangs, one rank is
usually waiting in a collective that another rank never called. With
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` each NCCL rank writes its buffer to a file
(``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank) when its watchdog sees the timeout, and
``python -m torch.distributed.flight_recorder.fr_trace`` (``torchfrtrace``; in the wheels of torch 2.11
and 2.13, not 2.9.1)
reads the files of all ranks and names the mismatch. ``first_divergence`` is that reading in its
simplest form, on the traces the ranks return.

Taught in chapter 02 (appendix 02a, section 6); the NCCL recorder runs in tests/gpu/test_nccl_streams.py.
"""

from __future__ import annotations

from course_utils.runtime import compat

__all__ = ["recorded_collectives", "first_divergence"]


def recorded_collectives(nccl: bool = False) -> list[tuple[int, str, list]]:
    """This process's recorded collectives of the default group, oldest first:
    ``(sequence number, name, input sizes)``. ``nccl=True`` reads NCCL's recorder (CUDA builds)."""
    entries = compat.dump_flight_recorder(nccl=nccl).get("entries", [])
    return [
        (e["collective_seq_id"], e["profiling_name"], e["input_sizes"])
        for e in entries
        if not e.get("is_p2p") and e["process_group"][1] == "default_pg"
    ]


def first_divergence(traces: list[list[tuple[int, str, list]]]) -> str:
    """Where the ranks' traces (``recorded_collectives`` of each rank, in rank order) first differ:
    a collective some rank never reached, or two ranks calling different ones."""
    longest = max(len(t) for t in traces)
    for i in range(longest):
        calls = {rank: t[i] if i < len(t) else None for rank, t in enumerate(traces)}
        reached = {rank: c for rank, c in calls.items() if c is not None}
        missing = sorted(set(calls) - set(reached))
        kinds = {(c[1], str(c[2])) for c in reached.values()}
        if missing or len(kinds) > 1:
            seq, name, sizes = next(iter(reached.values()))
            if missing:
                return (
                    f"collective #{seq} ({name}, sizes {sizes}): reached by rank(s) "
                    f"{sorted(reached)}, never by rank(s) {missing}"
                )
            said = "; ".join(f"rank {r}: {c[1]} {c[2]}" for r, c in reached.items())
            return f"collective #{seq} differs between ranks: {said}"
    return f"all {len(traces)} ranks recorded the same {longest} collectives"
