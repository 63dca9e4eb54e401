"""Deterministic synthetic click logs shaped like Criteo's, with a planted click model.

Each row has ``n_dense`` heavy-tailed counts (``log1p``-transformed for the
model), one id per categorical table with Zipf-like frequencies (id 0 the most
frequent), and a click drawn from a known logistic model::

    logit = bias + dense effects + per-id effects + pairwise dot products of per-id factors
    prob  = sigmoid(logit),   label = 1 if uniform < prob

The dot products are exactly what a DLRM's dot interaction computes, so a DLRM
can learn the planted model; because ``prob`` is returned, the best AUC any
model can reach (the Bayes AUC) is known.

Same seed, same rows, on any machine: the random stream is numpy's
``Generator(PCG64(...))`` and ids, counts and the uniform draws behind labels
are computed from its raw 64-bit integers with integer arithmetic only. The
one transcendental function (``exp`` in the sigmoid) can move a label only if a
uniform draw lands within about 1e-16 of its probability.

Rows come in blocks of ``BLOCK_ROWS``; column ``c`` of block ``b`` of seed
``s`` is drawn from ``PCG64([s, b, c])``. So rows ``[a, b)`` can be made without making rows before
``a`` (``first_row=a``), e.g. each rank making only its own share.

Taught in chapter 01.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from course_utils.runtime.checks import check_sizes
from course_utils.workload.data.criteo import CRITEO_1TB_CARDINALITIES, CRITEO_KAGGLE_CARDINALITIES
from course_utils.workload.data.logs import ClickLogs

__all__ = ["PlantedClickModel", "make_click_logs", "criteo_cardinalities", "BLOCK_ROWS"]

BLOCK_ROWS = 1 << 16
_FACTOR_ROWS = 1 << 14  # ids beyond this share planted parameters through a hash
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = np.uint64(0xFFFFFFFF)
_OCTAVE_WEIGHT = 1 << 20  # integer weight of one full octave of ids
# Shape of the dense counts (fixed, seed-independent), cycled if n_dense > 13:
# counts are < 2**max_octave, and 0 with probability zero_percent / 100.
_DENSE_MAX_OCTAVE = (5, 11, 8, 6, 17, 10, 8, 6, 9, 3, 5, 6, 8)
_DENSE_ZERO_PERCENT = (45, 5, 20, 20, 3, 25, 30, 10, 5, 50, 50, 20, 25)


def criteo_cardinalities(scale: float = 1.0, *, source: str = "kaggle", minimum: int = 16) -> list[int]:
    """Criteo's table sizes, scaled: a few huge tables, many small ones.

    Each size becomes ``round(c * scale)``, but at least ``min(c, minimum)``: big
    id-like columns shrink, tiny ones (3 or 4 values) stay as they are.
    source: ``"kaggle"`` (7 days, largest 10.1M) or ``"1tb"`` (MLPerf, largest 40M).
    """
    tables = {"kaggle": CRITEO_KAGGLE_CARDINALITIES, "1tb": CRITEO_1TB_CARDINALITIES}
    if source not in tables:
        raise ValueError(f"source must be 'kaggle' or '1tb', got {source!r}.")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}.")
    return [max(min(c, minimum), int(round(c * scale))) for c in tables[source]]


def _octave_ids(raw: np.ndarray, cardinality: int) -> np.ndarray:
    """Zipf-like ids in ``[0, cardinality)`` from raw uint64 draws, integer arithmetic only.

    Ids are grouped in octaves ``[2**L - 1, 2**(L+1) - 1)``; each full octave
    gets the same total probability (a partial last one proportionally less),
    spread evenly inside it. So ``P(id) ~ 1 / (id + 1)``: Zipf with exponent 1.
    """
    levels = cardinality.bit_length()
    last_lo = (1 << (levels - 1)) - 1
    last_width = cardinality - last_lo
    weights_total = (levels - 1) * _OCTAVE_WEIGHT + (_OCTAVE_WEIGHT * last_width) // (1 << (levels - 1))
    pick = (raw & _LOW32) % np.uint64(weights_total)
    octave = np.minimum(pick // np.uint64(_OCTAVE_WEIGHT), np.uint64(levels - 1))
    lo = (np.uint64(1) << octave) - np.uint64(1)
    width = np.minimum(np.uint64(1) << octave, np.uint64(cardinality) - lo)
    return (lo + (raw >> np.uint64(32)) % width).astype(np.int64)


def _counts(raw: np.ndarray, j: int) -> np.ndarray:
    """Heavy-tailed non-negative counts for dense column ``j`` (integer arithmetic only)."""
    max_octave = _DENSE_MAX_OCTAVE[j % len(_DENSE_MAX_OCTAVE)]
    zero = (raw & np.uint64(0xFFFF)) < np.uint64(
        _DENSE_ZERO_PERCENT[j % len(_DENSE_ZERO_PERCENT)] * 65536 // 100
    )
    octave = ((raw >> np.uint64(16)) & np.uint64(0xFFFF)) % np.uint64(max_octave)
    count = (np.uint64(1) << octave) + (raw >> np.uint64(32)) % (np.uint64(1) << octave)
    return np.where(zero, np.uint64(0), count).astype(np.int64)


def _approx_normal(rng: np.random.Generator, shape) -> np.ndarray:
    """Mean 0, variance 1, bell-shaped: ``2 * (u1 + u2 + u3 - 1.5)``. Only + and *,
    so the result does not depend on a platform's exp/log (unlike ``rng.normal``)."""
    return 2.0 * (rng.random((3, *shape)).sum(axis=0) - 1.5)


def _parameter_rows(ids: np.ndarray, n_rows: int) -> np.ndarray:
    """Row of the planted-parameter table for each id: the id itself for the
    ``n_rows`` most frequent ids, a multiplicative hash for the rare rest."""
    if ids.size == 0 or n_rows > ids.max():
        return ids
    bits = np.uint64(64 - int(n_rows).bit_length() + 1)
    hashed = ((ids.astype(np.uint64) * _GOLDEN) >> bits).astype(np.int64)
    return np.where(ids < n_rows, ids, hashed)


@dataclass(frozen=True)
class PlantedClickModel:
    """The "true" click model behind synthetic logs (same settings, same world).

    ctr: target click-through rate (the bias is calibrated to reach it).
    latent_dim: size of the per-id factors whose dot products form interactions.
    interacting_tables: how many tables (chosen by ``world_seed``) have factors;
        their pairs interact (like user x ad columns), the other tables only add effects.
    *_strength: scale of each part of the logit (0 switches a part off).
    world_seed: seed of the planted parameters; rows have their own seed, so
        train and test sets drawn with different row seeds share one world.
    """

    ctr: float = 0.2
    latent_dim: int = 4
    dense_strength: float = 0.8
    category_strength: float = 0.8
    interaction_strength: float = 1.0
    interacting_tables: int = 4
    world_seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.ctr < 1.0:
            raise ValueError(f"ctr must be strictly between 0 and 1, got {self.ctr}.")
        if self.latent_dim < 1 or self.interacting_tables < 0:
            raise ValueError(
                f"need latent_dim >= 1 and interacting_tables >= 0, "
                f"got {self.latent_dim} and {self.interacting_tables}."
            )

    def parameters(self, cardinalities: Sequence[int], n_dense: int) -> dict:
        """The planted parameters for these table sizes (built once, then cached)."""
        return _build_parameters(self, tuple(int(c) for c in cardinalities), int(n_dense))

    def logit(self, counts: np.ndarray, sparse: np.ndarray, cardinalities: Sequence[int]) -> np.ndarray:
        """True logit ``[N]`` float64 of rows with raw counts ``[N, n_dense]`` and ids ``[N, T]``."""
        params = self.parameters(cardinalities, counts.shape[1])
        return params["bias"] + _centred_logit(params, list(counts.T), list(sparse.T))


def _centred_logit(params: dict, count_cols: list, id_cols: list) -> np.ndarray:
    """The logit ``[n]`` without its bias, from ``n_dense`` count columns ``[n]`` and
    ``T`` id columns ``[n]``. Elementwise sums in a fixed order (no reductions
    whose order could depend on the machine)."""
    n = len(id_cols[0]) if id_cols else len(count_cols[0])
    out = np.zeros(n, dtype=np.float64)
    for j, c in enumerate(count_cols):  # a saturating effect of each count: w * (c / (c + m) - 1/2)
        c = c.astype(np.float64)
        out += params["dense_w"][j] * (c / (c + params["dense_mid"][j]) - 0.5)
    factor_sum = np.zeros((n, params["latent_dim"]), dtype=np.float64)
    factor_sq = np.zeros(n, dtype=np.float64)
    for t, ids in enumerate(id_cols):
        rows = _parameter_rows(ids, len(params["effect"][t]))
        out += params["effect"][t][rows]
        if t in params["factor"]:
            factor_sum += params["factor"][t][rows]
            factor_sq += params["factor_sq"][t][rows]
    pair_sum = np.zeros(n, dtype=np.float64)  # sum over table pairs s < t of <f_s, f_t>
    for d in range(factor_sum.shape[1]):
        pair_sum += factor_sum[:, d] * factor_sum[:, d]
    return out + params["pair_scale"] * 0.5 * (pair_sum - factor_sq)


@functools.lru_cache(maxsize=8)
def _build_parameters(model: PlantedClickModel, cardinalities: tuple, n_dense: int) -> dict:
    rng = np.random.Generator(np.random.PCG64([model.world_seed, 0x5EED]))
    n_tables = len(cardinalities)
    importance = 0.25 + 0.75 * rng.random(n_tables)  # some columns matter more
    sign = np.where(rng.random(n_dense) < 0.5, -1.0, 1.0)
    params = {
        "latent_dim": model.latent_dim,
        "dense_w": sign * (0.5 + rng.random(n_dense)) * model.dense_strength * 2.0 / np.sqrt(max(n_dense, 1)),
        "dense_mid": np.array(
            [float(1 << (_DENSE_MAX_OCTAVE[j % len(_DENSE_MAX_OCTAVE)] // 2)) for j in range(n_dense)]
        ),
        "effect": [],
        "factor": {},
        "factor_sq": {},
    }
    interacting = sorted(rng.permutation(n_tables)[: min(model.interacting_tables, n_tables)].tolist())
    k = len(interacting)
    params["interacting"] = interacting
    params["pair_scale"] = model.interaction_strength / np.sqrt(max(k * (k - 1) / 2, 1) * model.latent_dim)
    for t, card in enumerate(cardinalities):
        rows = min(card, _FACTOR_ROWS)
        params["effect"].append(
            _approx_normal(rng, (rows,))
            * importance[t]
            * model.category_strength
            / np.sqrt(max(n_tables, 1))
            * 2.0
        )
        if t in interacting:
            factor = _approx_normal(rng, (rows, model.latent_dim))
            squared = np.zeros(rows)
            for d in range(model.latent_dim):
                squared += factor[:, d] * factor[:, d]
            params["factor"][t], params["factor_sq"][t] = factor, squared
    # Calibrate the bias on a fixed sample so the mean click probability is `ctr`.
    counts, ids, _ = _draw_block([model.world_seed, 0xCA11B], 1 << 14, cardinalities, n_dense)
    centred = _centred_logit(params, counts, ids)
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.mean(1.0 / (1.0 + np.exp(-(centred + mid)))) < model.ctr else (lo, mid)
    params["bias"] = 0.5 * (lo + hi)
    return params


def _draw_block(key: list, n: int, cardinalities: tuple, n_dense: int):
    """Raw count columns (``n_dense`` x ``[n]`` int64), id columns (``T`` x ``[n]``
    int64) and the label draws ``[n]`` uint64 of one block.

    Every column has its own stream ``PCG64(key + [column])``, so the first ``n``
    rows of a block do not depend on how many rows are drawn after them.
    """

    def raw(column: int) -> np.ndarray:
        return np.random.PCG64([*key, column]).random_raw(n)

    counts = [_counts(raw(j), j) for j in range(n_dense)]
    ids = [_octave_ids(raw(n_dense + t), card) for t, card in enumerate(cardinalities)]
    return counts, ids, raw(n_dense + len(cardinalities))


def make_click_logs(
    n_rows: int,
    *,
    seed: int = 0,
    cardinalities: Sequence[int] | None = None,
    n_dense: int = 13,
    first_row: int = 0,
    planted: PlantedClickModel = PlantedClickModel(),
) -> ClickLogs:
    """Rows ``[first_row, first_row + n_rows)`` of the synthetic click log of ``seed``.

    cardinalities: ids per categorical table; default ``criteo_cardinalities(1/1000)``
        (26 tables shaped like Criteo's, 3 .. 10,131 ids). Any size up to 2**31 - 1
        works: planted parameters are kept for at most 16,384 rows per table.
    planted: the true click model (same ``planted``, same world).
    Returns ClickLogs: ``dense [N, n_dense] float32`` (``log1p`` of counts),
    ``sparse [N, T] int64``, ``label [N] float32``, ``prob [N] float32``.
    """
    if n_rows < 0 or first_row < 0:
        raise ValueError(f"n_rows and first_row must be >= 0, got {n_rows} and {first_row}.")
    if n_dense < 0:
        raise ValueError(f"n_dense must be >= 0, got {n_dense}.")
    cards = criteo_cardinalities(1 / 1000) if cardinalities is None else cardinalities
    cards = check_sizes(cards, most=(1 << 31) - 1)
    params = planted.parameters(cards, n_dense)
    n_tables = len(cards)
    dense = np.empty((n_rows, n_dense), np.float32)
    sparse = np.empty((n_rows, n_tables), np.int64)
    label = np.empty(n_rows, np.float32)
    prob = np.empty(n_rows, np.float32)
    end = first_row + n_rows
    for block in range(first_row // BLOCK_ROWS, -(-end // BLOCK_ROWS)):
        lo = max(first_row - block * BLOCK_ROWS, 0)  # rows [lo, hi) of this block are wanted
        hi = min(end - block * BLOCK_ROWS, BLOCK_ROWS)
        counts, ids, u = _draw_block([seed, block], hi, cards, n_dense)
        p = 1.0 / (1.0 + np.exp(-(params["bias"] + _centred_logit(params, counts, ids))))
        at = slice(block * BLOCK_ROWS + lo - first_row, block * BLOCK_ROWS + hi - first_row)
        if n_dense:
            dense[at] = np.log1p(np.stack(counts, axis=1)[lo:].astype(np.float32))
        sparse[at] = np.stack(ids, axis=1)[lo:]
        label[at] = (u[lo:] >> np.uint64(11)) * (1.0 / (1 << 53)) < p[lo:]  # exact uniform in [0, 1)
        prob[at] = p[lo:]
    return ClickLogs(dense, sparse, label, prob, cards)
