"""The job's ``--table-optimizer`` against its checkpoints: resume with the optimizer that wrote them.

The optimizers themselves: ``course_utils.sharding.table_optimizer``.

Taught in chapter 08 (appendix 08b, incremental checkpoints).
"""

from __future__ import annotations

from course_utils.scripts.job_checks import JobInputError, checkpoint_flag
from course_utils.sharding.table_optimizer import TABLE_OPTIMIZERS

__all__ = ["check_checkpoint_optimizer"]


def check_checkpoint_optimizer(folder, table_optimizer: str) -> None:
    """``JobInputError`` (one line) when the newest complete checkpoint in ``folder`` (or URL) holds the
    tables' state of another optimizer than ``table_optimizer`` (loading it would mix the two)."""
    from course_utils.checkpoint import latest_complete, safe_load

    newest = latest_complete(folder)
    if newest is None:
        return
    try:
        metadata = safe_load.read_metadata(newest).state_dict_metadata
    except safe_load.CheckpointRefused:
        return  # a folder not to be loaded at all: check_checkpoint_matches says so, in one line
    saved = {key.rsplit("/", 1)[1] for key in metadata if key.startswith("optim/embeddings.table")}
    found = [name for name, keys in TABLE_OPTIMIZERS.items() if saved == set(keys)]
    if saved and found != [table_optimizer]:
        there = found[0] if found else f"state {sorted(saved)}"
        flag = checkpoint_flag(folder)
        raise JobInputError(
            f"{flag} {folder}: {newest.name} was trained with --table-optimizer {there}, "
            f"not {table_optimizer}; resume with --table-optimizer {there}, or pass a new {flag}"
        )
