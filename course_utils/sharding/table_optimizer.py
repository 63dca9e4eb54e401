"""The hybrid DLRM's optimizers: Adam over everything, or Adagrad for the tables and Adam for the MLPs.

The production job's ``--table-optimizer`` (``course_utils.scripts.train_hybrid``):

* ``adam`` (the job's default): ``torch.optim.Adam`` over every parameter, tables and MLPs. Adam
  moves every row at every step, even a row no id looked up (its first moment decays, it is not
  zero), so every row of every table changes between two checkpoints;
* ``adagrad``: ``torch.optim.Adagrad`` for the table shards (``table_lr``), Adam for the MLPs,
  the split of appendix 07f's middle ground (its section 1). Adagrad's update of a row whose gradient
  is zero is ``-lr * 0 / (sqrt(sum) + eps)``, a zero, and its running ``sum`` gains ``0 * 0``: a
  row no id looked up keeps its weights and its state bit for bit. That makes an incremental
  checkpoint of the touched rows exact (``course_utils.checkpoint.incremental``).

MLPerf's DLRM-DCNv2 reference (``mlcommons/training``, ``recommendation_v2/torchrec_dlrm/
dlrm_main.py``) trains its tables with ``torch.optim.Adagrad`` too (fused into the backward pass:
FBGEMM's ``EXACT_ADAGRAD``), and its dense part with Adagrad as well.

The two optimizers are stepped as one (``workload.sparse_optim.Optimizers``) and expose a ``state``
that the sharded checkpoint reads and fills (``checkpoint.sharded``): each parameter's own
optimizer's.

Taught in chapter 08 (appendix 08b, incremental checkpoints).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from course_utils.workload.sparse_optim import Optimizers
from course_utils.workload.train import make_optimizer

__all__ = ["TABLE_OPTIMIZERS", "TablesAndDense", "hybrid_optimizer"]

#: name -> the state its tables keep (a checkpoint's ``optim/embeddings.table<t>/<key>``).
TABLE_OPTIMIZERS = {"adam": ("exp_avg", "exp_avg_sq", "step"), "adagrad": ("step", "sum")}


class _State(Mapping):
    """``state[p]``: parameter ``p``'s state in the optimizer that holds ``p`` (read and written)."""

    def __init__(self, optimizers):
        self.optimizers = optimizers

    def _owner(self, p):
        for o in self.optimizers:
            if any(p is q for group in o.param_groups for q in group["params"]):
                return o
        return None

    def __getitem__(self, p):
        owner = self._owner(p)
        if owner is None:
            raise KeyError("a parameter no optimizer here holds")
        return owner.state[p]

    def __iter__(self):
        return (p for o in self.optimizers for p in o.state)

    def __len__(self) -> int:
        return sum(len(o.state) for o in self.optimizers)


class TablesAndDense(Optimizers):
    """``Optimizers`` (stepped as one) with ``state``: each parameter's state in its own optimizer."""

    @property
    def state(self) -> Mapping:
        return _State(self.optimizers)


def hybrid_optimizer(model, table_optimizer: str = "adam", lr: float = 1e-2, table_lr: float | None = None):
    """The job's optimizer over a ``HybridDLRM`` (its ``embeddings`` shards and ``dense`` MLPs):
    ``"adam"``: ``torch.optim.Adam(model.parameters(), lr)``, as the job always had; ``"adagrad"``:
    Adagrad over the shards (``table_lr``, default ``lr``) and Adam over the MLPs (``lr``)."""
    if table_optimizer not in TABLE_OPTIMIZERS:
        raise ValueError(
            f"table_optimizer must be one of {sorted(TABLE_OPTIMIZERS)}, got {table_optimizer!r}"
        )
    if table_optimizer == "adam":
        return make_optimizer(model, "adam", lr)
    return TablesAndDense(
        torch.optim.Adagrad(list(model.embeddings.parameters()), lr=table_lr or lr),
        torch.optim.Adam(model.dense.parameters(), lr=lr),
    )
