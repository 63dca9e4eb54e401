"""Incremental checkpoints of embedding tables: one full base, then only the rows touched since.

A recommender's tables are most of its state, and a step looks up few of their rows: an
incremental checkpoint saves, at each save after the first, only the rows whose gradient was
not zero since the previous save (their ids, their weights and their rows of optimizer state),
plus the small dense part whole. Restoring loads the base, then applies each delta in order.

That is exact only when a row no id looked up does not change. Adagrad's tables
(``scripts.job_optimizer``, ``--table-optimizer adagrad``) satisfy it; Adam does not: it moves every
row at every step, so its "delta" would have to hold every row (:func:`rows_changed` shows it).

A snapshot is a flat dict of tensors (``torch.save``, read back with ``weights_only=True``: no
code runs on load), one file per rank, each rank saving its own shards:

* ``model/<name>``, ``optim/<name>/<key>``: a whole tensor (every entry in the base; the dense
  part's, and scalar state such as Adagrad's ``step``, in every delta);
* ``rows/<name>`` ``[k]`` int64: a delta's rows of table shard ``<name>``, and then
  ``model/<name>`` ``[k, D]`` and ``optim/<name>/<key>`` ``[k, ...]`` hold just those rows.

``<name>`` is the model's own checkpoint name (``HybridDLRM.checkpoint_entries``:
``embeddings.table3``, ``dense.top.0.weight``). Checkpoints of the touched rows are how large
production recommenders bound their save cost (Eisenman et al., "Check-N-Run", NSDI 2022);
TorchRec tracks the touched ids in ``torchrec.distributed.model_tracker`` (``ModelDeltaTracker``).

Taught in chapter 08 (appendix 08b, incremental checkpoints).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = [
    "TouchedRows",
    "full_snapshot",
    "delta_snapshot",
    "restore",
    "snapshot_bytes",
    "rows_changed",
    "save_snapshot",
    "load_snapshot",
    "differing_tensors",
]

TABLES = "embeddings."  # the prefix of a table shard's checkpoint name


def _entries(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p, _ in model.checkpoint_entries()]


class TouchedRows:
    """The rows of each table shard of ``model`` whose gradient was not zero at some step since
    the last :meth:`take`. Call :meth:`record` after every optimizer step (the gradients are
    still there: the job's step zeroes them at its start)."""

    def __init__(self, model):
        self.tables = [(n, p) for n, p in _entries(model) if n.startswith(TABLES)]
        self.masks = {n: torch.zeros(p.shape[0], dtype=torch.bool, device=p.device) for n, p in self.tables}

    def record(self) -> None:
        for name, p in self.tables:
            if p.grad is not None:
                self.masks[name] |= p.grad.ne(0).any(dim=1)

    def take(self) -> dict[str, torch.Tensor]:
        """``{name: ids [k] int64, ascending}`` of the touched rows; forgets them."""
        out = {n: m.nonzero().squeeze(1).cpu() for n, m in self.masks.items()}
        for m in self.masks.values():
            m.zero_()
        return out


def _state(optimizer, p) -> dict:
    state = optimizer.state.get(p)
    return {} if state is None else state


def full_snapshot(model, optimizer) -> dict[str, torch.Tensor]:
    """Every entry's weights and optimizer state, whole (on the CPU)."""
    out = {}
    for name, p in _entries(model):
        out[f"model/{name}"] = p.detach().cpu().clone()
        for key, value in _state(optimizer, p).items():
            out[f"optim/{name}/{key}"] = torch.as_tensor(value).detach().cpu().clone()
    return out


def _row_shaped(value, p) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == p.shape[0]


def delta_snapshot(model, optimizer, touched: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rows ``touched`` (``TouchedRows.take()``) of each table shard, with their rows of
    optimizer state; the dense part and scalar state whole."""
    out = {}
    for name, p in _entries(model):
        rows = touched.get(name)
        if rows is None:  # the dense part
            out[f"model/{name}"] = p.detach().cpu().clone()
        else:
            out[f"rows/{name}"] = rows
            out[f"model/{name}"] = p.detach()[rows.to(p.device)].cpu()
        for key, value in _state(optimizer, p).items():
            whole = rows is None or not _row_shaped(value, p)
            value = torch.as_tensor(value).detach()
            out[f"optim/{name}/{key}"] = (value if whole else value[rows.to(value.device)]).cpu().clone()
    return out


@torch.no_grad()
def restore(model, optimizer, snapshots) -> None:
    """Fill ``model`` and ``optimizer`` from a base (``full_snapshot``) and then each delta in
    order (``delta_snapshot``); every rank restores its own shards from its own snapshots."""
    snapshots = list(snapshots)
    if not snapshots or any(k.startswith("rows/") for k in snapshots[0]):
        raise ValueError("restore needs a full snapshot first (full_snapshot), then the deltas in order")
    for snapshot in snapshots:
        for name, p in _entries(model):
            rows = snapshot.get(f"rows/{name}")
            saved = snapshot[f"model/{name}"].to(p.device)
            if rows is None:
                p.copy_(saved)
            else:
                p[rows.to(p.device)] = saved
            prefix = f"optim/{name}/"
            for key in [k[len(prefix) :] for k in snapshot if k.startswith(prefix)]:
                value, state = snapshot[prefix + key], optimizer.state[p]
                if rows is None or key not in state or not _row_shaped(state[key], p):
                    state[key] = value.clone().to(p.device) if value.dim() else value.clone()
                else:
                    state[key][rows.to(state[key].device)] = value.to(state[key].device)


def snapshot_bytes(snapshot: dict[str, torch.Tensor]) -> int:
    """Bytes of a snapshot's tensors (ids, rows, state): what it adds to storage."""
    return sum(t.numel() * t.element_size() for t in snapshot.values())


def rows_changed(before: torch.Tensor, after: torch.Tensor) -> int:
    """How many rows of ``[n, D]`` differ (any element, bit for bit) between two copies."""
    return int(before.ne(after).any(dim=1).sum())


def save_snapshot(snapshot: dict[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write a snapshot with ``torch.save``, under a temporary name and then renamed (a killed
    write leaves no snapshot). Returns the path."""
    path = Path(path)
    partial = path.with_suffix(".partial")
    torch.save(snapshot, partial)
    os.replace(partial, path)
    return path


def load_snapshot(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A snapshot written by :func:`save_snapshot`, read as data (``weights_only=True``)."""
    return torch.load(path, weights_only=True)


def differing_tensors(model, optimizer, other_model, other_optimizer) -> list[str]:
    """Names (``model/...``, ``optim/.../key``) whose tensors are not bit-identical
    (``torch.equal``) between two models and their optimizers; ``[]`` when all agree."""
    a, b = full_snapshot(model, optimizer), full_snapshot(other_model, other_optimizer)
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not torch.equal(a[k], b[k]))
