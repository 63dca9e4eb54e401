"""A memory budget per rank, enforced: "does not fit" made real on one machine.

A rank trains its parameters with three kinds of state per value: the weight, its
gradient (dense: one value per weight) and the optimizer's copies (Adam: 2). A
:class:`MemoryBudget` refuses a plan under which some rank would need more than
``bytes_per_rank`` (before anything is allocated), and :meth:`MemoryBudget.enforce`
checks the tensors a rank really holds after a training step.

Taught in chapter 07 (section 12, capstone: tables that do not fit one rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_utils.runtime.checks import check_choice
from course_utils.sharding.plan import ShardingPlan
from course_utils.workload.models import OPTIMIZER_STATE_COPIES, format_bytes

__all__ = ["MemoryBudget", "BudgetExceededError"]


class BudgetExceededError(MemoryError):
    """A rank would hold (or holds) more training state than its budget."""


@dataclass(frozen=True)
class MemoryBudget:
    """At most ``bytes_per_rank`` bytes of weights + gradients + ``optimizer`` state per rank."""

    bytes_per_rank: int
    optimizer: str = "adam"
    itemsize: int = 4

    def __post_init__(self):
        check_choice("optimizer", self.optimizer, OPTIMIZER_STATE_COPIES)
        if self.bytes_per_rank <= 0:
            raise ValueError(f"bytes_per_rank must be positive, got {self.bytes_per_rank}")

    @property
    def copies(self) -> int:
        """Values of training state per parameter value: weight, gradient, optimizer copies."""
        return 2 + OPTIMIZER_STATE_COPIES[self.optimizer]

    def training_bytes(self, n_values: int) -> int:
        return n_values * self.itemsize * self.copies

    def need(self, plan: ShardingPlan, extra_values: int = 0) -> list[int]:
        """Training bytes each rank needs under ``plan`` (``extra_values``: other parameters
        every rank holds, such as replicated dense layers)."""
        return [
            self.training_bytes(b // self.itemsize + extra_values) for b in plan.bytes_per_rank(self.itemsize)
        ]

    def check(self, plan: ShardingPlan, extra_values: int = 0) -> None:
        """Raise :class:`BudgetExceededError` if any rank would exceed the budget."""
        need = self.need(plan, extra_values)
        over = [r for r, n in enumerate(need) if n > self.bytes_per_rank]
        if not over:
            return
        r = over[0]
        what = f"weights + gradients + {self.optimizer} state, x{self.copies}"
        msg = (
            f"rank {r} would need {format_bytes(need[r])} ({what}) under this {plan.kind.replace('_', '-')} "
            f"plan, over its budget of {format_bytes(self.bytes_per_rank)}. "
        )
        biggest = max(range(plan.n_tables), key=lambda t: plan.cardinalities[t])
        alone = self.training_bytes(plan.cardinalities[biggest] * plan.dim + extra_values)
        if plan.kind == "table_wise" and alone > self.bytes_per_rank:
            msg += (
                f"Table {biggest} alone needs {format_bytes(alone)}: no table-wise plan can fit; "
                "shard it row-wise or column-wise."
            )
        else:
            msg += "Use more ranks, row-wise or column-wise sharding, or a leaner optimizer."
        raise BudgetExceededError(msg)

    def held(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Bytes a rank really holds: its parameters, their gradients and the optimizer's state tensors."""
        params = list(module.parameters())
        total = sum(p.numel() * p.element_size() for p in params)
        total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
        if optimizer is not None:
            total += sum(
                v.numel() * v.element_size()
                for p in params
                for v in optimizer.state.get(p, {}).values()
                if torch.is_tensor(v) and v.dim() > 0
            )
        return total

    def enforce(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Measure :meth:`held`; raise :class:`BudgetExceededError` if over budget, else return it."""
        held = self.held(module, optimizer)
        if held > self.bytes_per_rank:
            raise BudgetExceededError(
                f"this rank holds {format_bytes(held)} of parameters, gradients and "
                f"optimizer state, over its budget of {format_bytes(self.bytes_per_rank)}"
            )
        return held
