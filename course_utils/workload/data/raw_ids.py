"""Raw ids as a production log holds them: 63-bit numbers from a space no table can hold.

The synthetic logs (``synthetic.py``) draw each categorical id as a *frequency rank* in
``[0, cardinality)``: id 0 is the most frequent, and the id is the row of its table. Real logs
hold no such thing: a user id, an ad id or a hashed URL is a large number whose value says
nothing about how often it occurs, drawn from a space far larger than any table
(``input_hash_size = 2**63`` is TorchRec's default for managed-collision modules).

:func:`raw_ids` turns the frequency ranks into such numbers: a bijection of ``[0, 2**63)``
(multiply by an odd constant, xor-shift, multiply again, all modulo ``2**63``), with a different
constant per table. Distinct ranks stay distinct raw ids, so the planted click model, which is a
function of the rank, is a function of the raw id too: two raw ids that a smaller table puts in one
row really have different click effects. Draw logs with a large ``cardinalities`` (the raw id
space: how many distinct ids each column can hold), then::

    logs = make_click_logs(n, cardinalities=[1 << 17] * 3, n_dense=0)
    raw = raw_ids(logs.sparse)          # [N, T] int64 in [0, 2**63): what a model is given

Integer arithmetic only: the same raw ids on every machine.

Taught in chapter 07 (appendix 07e, ids that collide).
"""

from __future__ import annotations

import numpy as np

__all__ = ["RAW_ID_BITS", "raw_ids"]

RAW_ID_BITS = 63  # raw ids lie in [0, 2**63): non-negative int64, like TorchRec's input_hash_size
_MASK = np.uint64((1 << RAW_ID_BITS) - 1)
_ODD = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """A bijection of ``[0, 2**63)`` (uint64 in, uint64 out): each step is invertible modulo 2**63."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(salt) * _ODD[0]) & _MASK  # a shift per table
        x = (x * _ODD[1]) & _MASK  # odd multiplier: invertible modulo 2**63
        x ^= x >> np.uint64(31)  # xor with a right shift: invertible
        x = (x * _ODD[2]) & _MASK
        x ^= x >> np.uint64(29)
    return x


def raw_ids(ranks: np.ndarray) -> np.ndarray:
    """Raw ids ``[N, T]`` int64 in ``[0, 2**63)`` of frequency-rank ids ``[N, T]`` (or ``[N]``, one table).

    Column ``t`` gets its own bijection, so equal ranks in two tables are different raw ids and
    equal raw ids within a column are equal ranks.
    """
    ranks = np.asarray(ranks)
    if ranks.ndim not in (1, 2) or not np.issubdtype(ranks.dtype, np.integer):
        raise ValueError(f"ranks must be integer ids [N] or [N, T], got {ranks.dtype} {ranks.shape}.")
    if ranks.size and ranks.min() < 0:
        raise ValueError(f"ranks must be >= 0, found {int(ranks.min())}; pass ClickLogs.sparse.")
    columns = ranks.reshape(len(ranks), -1).astype(np.uint64)
    out = np.stack([_mix(columns[:, t], t + 1) for t in range(columns.shape[1])], axis=1)
    return out.astype(np.int64).reshape(ranks.shape)
