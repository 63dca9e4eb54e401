"""Embedding tables in fewer bytes: FP16, and INT8 row-wise with a scale and a bias per row.

* **FP16**: each value rounded to half precision (2 bytes), relative error at most ``2**-11``
  for values in FP16's normal range (about ``6e-5`` to ``65504`` in magnitude).
* **INT8 row-wise** (FBGEMM's "fused 8-bit row-wise" format): each row ``x [D]`` is stored as ``D``
  bytes ``q = round((x - bias) / scale)`` with ``bias = min(x)`` and ``scale = (max(x) - min(x)) /
  255``, and the two floats appended: ``D + 8`` bytes a row. Reading a row back gives
  ``q * scale + bias``, within ``scale / 2`` of each value. FBGEMM's kernel
  (``fbgemm_gpu/src/quantize_ops/quantize_fused_8bit_rowwise.cu``) rounds with ``lrintf`` of
  ``(x - min) * 255 / (range + 1e-20)``; PyTorch's ``torch.ops.quantized.embedding_bag_byte_prepack``
  writes the same layout (``fused_rowwise_int8`` returns it, compared in the tests). FBGEMM's
  inference tables (``IntNBitTableBatchedEmbeddingBagsCodegen``) store the scale and bias as two
  FP16 numbers instead (``DEFAULT_SCALE_BIAS_SIZE_IN_BYTES = 4``) and pad rows to 16 bytes.

``dequantized`` gives the numbers a lookup of such a table reads, as an fp32 table of the same
shape: a model evaluated with them computes what one with quantized tables computes.

Taught in chapter 07 (appendix 07d, memory tiers).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from course_utils.runtime.checks import check_choice

__all__ = [
    "FORMATS",
    "row_bytes",
    "table_bytes",
    "quantize_rowwise_int8",
    "dequantize_rowwise_int8",
    "fused_rowwise_int8",
    "dequantized",
    "with_tables_as",
]

#: name -> bytes per row of ``D`` values (FBGEMM's training layout for INT8: D bytes + fp32 scale and bias)
FORMATS = {"fp32": lambda d: 4 * d, "fp16": lambda d: 2 * d, "int8": lambda d: d + 8}


def row_bytes(dim: int, fmt: str) -> int:
    """Bytes one row of ``dim`` values takes in ``fmt`` (``"fp32"``, ``"fp16"`` or ``"int8"``)."""
    check_choice("format", fmt, FORMATS)
    return FORMATS[fmt](int(dim))


def table_bytes(rows, dim: int, fmt: str) -> int:
    """Bytes of tables of ``rows`` (an int or a list of ints) rows of ``dim`` values in ``fmt``."""
    total = sum(rows) if hasattr(rows, "__iter__") else int(rows)
    return total * row_bytes(dim, fmt)


def quantize_rowwise_int8(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``table [N, D] float32`` -> ``(q [N, D] uint8, scale [N] float32, bias [N] float32)``."""
    if table.dim() != 2 or table.dtype != torch.float32:
        raise ValueError(f"need a float32 table [N, D], got {table.dtype} of shape {tuple(table.shape)}")
    low, high = table.min(dim=1).values, table.max(dim=1).values
    spread = high - low
    scale = spread / 255.0
    inverse = 255.0 / (spread + 1e-8)  # torch's prepack adds 1e-8 (FBGEMM's GPU kernel 1e-20): no 0/0
    q = torch.round((table - low[:, None]) * inverse[:, None])  # round half to even, like lrintf
    return q.to(torch.uint8), scale, low


def dequantize_rowwise_int8(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``[N, D] float32``: the values a lookup of the quantized rows reads, ``q * scale + bias``."""
    return q.float() * scale[:, None] + bias[:, None]


def fused_rowwise_int8(table: torch.Tensor) -> torch.Tensor:
    """``[N, D + 8] uint8``: each row's ``D`` bytes, then its scale and bias as float32 bytes."""
    q, scale, bias = quantize_rowwise_int8(table)
    tail = torch.stack([scale, bias], dim=1).contiguous().view(torch.uint8)  # [N, 8]
    return torch.cat([q, tail], dim=1)


def dequantized(table: torch.Tensor, fmt: str) -> torch.Tensor:
    """``table [N, D] float32`` stored in ``fmt`` and read back, as float32 ``[N, D]``."""
    check_choice("format", fmt, FORMATS)
    if fmt == "fp32":
        return table.clone()
    if fmt == "fp16":
        return table.half().float()
    return dequantize_rowwise_int8(*quantize_rowwise_int8(table))


@torch.no_grad()
def with_tables_as(model: nn.Module, fmt: str) -> nn.Module:
    """A copy of a DLRM (anything with ``.embeddings``, a list of ``EmbeddingBag``) whose tables
    hold what ``fmt`` stores; the MLPs stay float32."""
    quantized = copy.deepcopy(model)
    for bag in quantized.embeddings:
        bag.weight.copy_(dequantized(bag.weight.detach(), fmt))
    return quantized
