"""The production job's model and optimizer, checkpointed incrementally and restored, in every rank.

``incremental_run`` trains the job's ``HybridDLRM`` (row-wise tables, the MLPs under DDP) on the
seeded synthetic click log with the job's optimizer (``sharding.table_optimizer``), saves a full
snapshot after the first step and a delta of the touched rows every ``save_every`` steps after it
(``checkpoint.incremental``), then restores a model built from another seed from those files and
compares it with the live one, tensor by tensor.

Taught in chapter 08 (appendix 08b, incremental checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from course_utils.checkpoint import incremental
from course_utils.sharding.hybrid import HybridDLRM, local_rows
from course_utils.sharding.table_optimizer import hybrid_optimizer
from course_utils.workload import data
from course_utils.workload.data.loaders import InMemoryBatches
from course_utils.workload.models import DLRMConfig
from course_utils.workload.train import train_step

__all__ = ["incremental_run"]


def incremental_run(
    table_optimizer: str,
    folder: str,
    *,
    saves: int = 3,
    save_every: int = 10,
    batch_size: int = 512,
    scale: float = 1 / 100,
    lr: float = 1e-2,
    table_lr: float = 0.05,
    seed: int = 0,
) -> dict:
    """Run in every rank (``launch``). ``1 + saves * save_every`` steps of ``batch_size`` rows
    (global) on Criteo-shaped tables (``data.criteo_cardinalities(scale)``); this rank's snapshots
    go into ``folder`` (``rank<R>_step<N>.pt``).

    Returns, for this rank: ``"rows"`` (rows of its shards), ``"touched"``, ``"changed"`` and
    ``"ever"`` (per save interval: rows with a gradient in it, rows whose weights changed in it,
    rows with a gradient at any step so far), ``"full_bytes"`` (the
    base), ``"delta_bytes"`` (each delta), ``"differ"`` (names whose tensors differ between the
    restored and the live model and optimizer; ``[]`` when bit-identical), ``"base_alone_differ"``
    (the same, restored from the base only: the deltas matter).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    cards = data.criteo_cardinalities(scale)
    logs = data.make_click_logs(batch_size * (1 + saves * save_every), seed=seed, cardinalities=cards)
    config = DLRMConfig(cardinalities=logs.cardinalities)
    model = HybridDLRM(config, "row_wise", seed=seed)
    optimizer = hybrid_optimizer(model, table_optimizer, lr, table_lr)
    touched, ever, out = incremental.TouchedRows(model), incremental.TouchedRows(model), Path(folder)
    tables = [p for _, p in touched.tables]
    result = {
        "rows": sum(p.shape[0] for p in tables),
        "touched": [],
        "changed": [],
        "ever": [],
        "delta_bytes": [],
    }
    files, before = [], None
    for step, batch in enumerate(InMemoryBatches(logs, batch_size, seed), start=1):
        train_step(model, optimizer, local_rows(batch, rank, world))
        touched.record()
        ever.record()
        if step == 1:
            snapshot = incremental.full_snapshot(model, optimizer)
            result["full_bytes"] = incremental.snapshot_bytes(snapshot)
            touched.take()
        elif (step - 1) % save_every == 0:
            rows = touched.take()
            result["touched"].append(sum(len(r) for r in rows.values()))
            result["ever"].append(int(sum(m.sum() for m in ever.masks.values())))
            result["changed"].append(
                sum(incremental.rows_changed(b, p.detach()) for b, p in zip(before, tables, strict=True))
            )
            snapshot = incremental.delta_snapshot(model, optimizer, rows)
            result["delta_bytes"].append(incremental.snapshot_bytes(snapshot))
        else:
            continue
        files.append(incremental.save_snapshot(snapshot, out / f"rank{rank}_step{step:04d}.pt"))
        before = [p.detach().clone() for p in tables]
    restored = HybridDLRM(config, "row_wise", seed=seed + 1)
    restored_optimizer = hybrid_optimizer(restored, table_optimizer, lr, table_lr)
    incremental.restore(restored, restored_optimizer, [incremental.load_snapshot(f) for f in files[:1]])
    result["base_alone_differ"] = incremental.differing_tensors(
        model, optimizer, restored, restored_optimizer
    )
    incremental.restore(restored, restored_optimizer, [incremental.load_snapshot(f) for f in files])
    result["differ"] = incremental.differing_tensors(model, optimizer, restored, restored_optimizer)
    return result
