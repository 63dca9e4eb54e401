"""Bytes per parameter that training with Adam keeps, by precision, and what sharding leaves.

Per parameter, training keeps the weight the model computes with, its gradient, and the
optimizer's state: for Adam two fp32 moments (8 bytes), plus an fp32 "master" copy of the
weight when the model computes in 16 bits (4 bytes). The ZeRO paper (Rajbhandari et al.
2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 3.1)
counts mixed-precision Adam as 2 (fp16 weight) + 2 (fp16 gradient) + K with K = 12
optimizer-state bytes (fp32 master weight, momentum, variance: 4 + 4 + 4) = 16 bytes, e.g. at
least 24 GB for GPT-2's 1.5 billion parameters. Keeping the gradients in fp32 (as Megatron
Core's distributed-optimizer guide lists for 16-bit parameters with fp32 gradients) gives 18.

Sharding over ``W`` data-parallel ranks divides what it shards (ZeRO section 5.1, figure 1):
stage 1 the optimizer state, stage 2 also the gradients, stage 3 (FSDP) also the weights.

* ``PRECISIONS``: the three schemes, as ``Precision`` rows: ``fp32``; ``mixed: 16-bit grads
  (ZeRO)``, bf16 or fp16 weights and gradients with an fp32 master copy; ``mixed: fp32 grads``;
* ``bytes_per_parameter(precision, world, stage)``: bytes one rank keeps per parameter;
* ``memory_table(world)``: all of it as a table.

Taught in chapter 05 (section 7, sharded data parallelism; appendix 05a, section 3, bytes per
parameter in mixed precision and per ZeRO stage).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Precision", "PRECISIONS", "bytes_per_parameter", "memory_table"]

ADAM_MOMENTS = 8  # Adam's exp_avg and exp_avg_sq, fp32: 4 + 4 bytes


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of one training scheme with Adam."""

    name: str
    weight: int  # the weight the forward and backward use
    gradient: int
    master: int  # the fp32 copy the optimizer updates (0 when the weight is fp32 already)
    moments: int = ADAM_MOMENTS

    @property
    def optimizer_state(self) -> int:
        """ZeRO's K: master copy + Adam's moments."""
        return self.master + self.moments

    @property
    def total(self) -> int:
        return self.weight + self.gradient + self.optimizer_state


PRECISIONS = (
    Precision("fp32", weight=4, gradient=4, master=0),
    Precision("mixed: 16-bit grads (ZeRO)", weight=2, gradient=2, master=4),
    Precision("mixed: fp32 grads", weight=2, gradient=4, master=4),
)


def bytes_per_parameter(precision: Precision, world: int = 1, stage: int = 0) -> float:
    """Bytes one of ``world`` data-parallel ranks keeps per parameter.

    stage 0: nothing sharded (DDP); 1: optimizer state / world; 2: also gradients;
    3: also weights (FSDP, ZeRO-3).
    """
    # details: a stage or world size that does not exist is refused
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive whole number of ranks, got {world!r}")
    # end details
    sharded = [precision.optimizer_state, precision.gradient, precision.weight][:stage]
    kept = [precision.optimizer_state, precision.gradient, precision.weight][stage:]
    return sum(kept) + sum(sharded) / world


def memory_table(world: int = 8):
    """One row per scheme: bytes per parameter held for weight, gradient, master copy, Adam's
    moments, their total, and the total per rank with each ZeRO stage on ``world`` ranks."""
    import pandas as pd

    rows = []
    for p in PRECISIONS:
        row = {"scheme": p.name, "weight": p.weight, "gradient": p.gradient, "master": p.master}
        row |= {"Adam moments": p.moments, "total": p.total}
        row |= {f"stage {s}, W={world}": bytes_per_parameter(p, world, s) for s in (1, 2, 3)}
        rows.append(row)
    return pd.DataFrame(rows).set_index("scheme")
