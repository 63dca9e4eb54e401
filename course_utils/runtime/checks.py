"""Input checks, each written once, so that the functions the chapters show read like their idea.

Every check raises an error that says what was expected, what came instead and, where
there is one, the fix. Nothing here imports the rest of ``course_utils``.

    check_ids(ids, cardinalities)        ids [B, T] (or [B, T, L]) int64, each id inside its table
    check_width(x, "dense", n)           a [B, n] tensor
    check_sizes(cardinalities)           table sizes: whole numbers >= 1, at least one table
    check_whole("world_size", n)         a whole number (bools refused), >= 1 by default
    check_choice("optimizer", name, options)   a name among known ones

Not taught in a chapter: the input checks the taught functions share, kept out of their way.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["check_ids", "check_width", "check_sizes", "check_whole", "check_choice"]


def check_ids(ids: torch.Tensor, cardinalities, *, name: str = "ids", bags: bool = False) -> None:
    """``ids`` must be ``[B, T]`` int64 (with ``bags``, also ``[B, T, L]``: ``L`` ids per table),
    ``T = len(cardinalities)``, and every id of table ``t`` in ``[0, cardinalities[t])``.

    ``cardinalities``: a sequence of ints, or a 1-D tensor of them on ``ids``' device (no copy per call).
    """
    import torch  # here, not at the top: course_utils.workload.data checks sizes without torch

    n_tables = len(cardinalities)
    shapes = (
        f"[B, {n_tables}] or [B, {n_tables}, L] (ids per table)"
        if bags
        else f"[B, {n_tables}] (one id per table)"
    )
    if ids.dim() not in ((2, 3) if bags else (2,)) or ids.shape[1] != n_tables:
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(ids.shape)}")
    if ids.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 ids, got {ids.dtype}; use {name}.long()")
    if not ids.numel() or ids.is_meta:  # a tensor on the meta device has shapes, no values to check
        return
    per_bag = ids.reshape(ids.shape[0], n_tables, -1)  # [B, T, L]
    low, high = per_bag.amin(dim=(0, 2)), per_bag.amax(dim=(0, 2))  # [T] each
    limit = torch.as_tensor(cardinalities, device=ids.device)
    bad = (low < 0) | (high >= limit)
    if bad.any():
        t = int(bad.nonzero()[0])
        raise IndexError(
            f"table {t} has {int(cardinalities[t])} rows but got ids in "
            f"[{int(low[t])}, {int(high[t])}]; hash or clip ids into range"
        )


def check_width(x: torch.Tensor, name: str, width: int) -> None:
    """``x`` must be a ``[B, width]`` tensor."""
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{name} must be [B, {width}], got shape {tuple(x.shape)}")


def check_sizes(sizes: Sequence, name: str = "cardinalities", *, most: int | None = None) -> tuple:
    """``sizes`` as a tuple of ints: at least one, each ``>= 1`` (and ``<= most``)."""
    values = tuple(int(s) for s in sizes)
    if not values or min(values) < 1 or (most is not None and max(values) > most):
        bound = "" if most is None else f", at most {most:,} rows each"
        raise ValueError(
            f"{name} must be positive table sizes{bound} (and at least one table), got {list(sizes)[:6]}"
        )
    return values


def check_whole(name: str, value, low: int = 1) -> None:
    """``value`` must be a whole number (an int or a numpy integer; not a bool or a float) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


def check_choice(what: str, name, options, hint: str = "") -> None:
    """``name`` must be one of ``options`` (any container of names)."""
    if name not in options:
        raise ValueError(f"unknown {what} {name!r}; choose one of {sorted(options)}{hint}")
