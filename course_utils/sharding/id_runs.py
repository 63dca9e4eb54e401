"""What collisions cost: one small click model trained on rows from a hash, a vocabulary or a remapper.

The model is logistic regression over embeddings of width 1 (one learned number per row of each
table, plus a bias): the smallest model whose AUC depends on which ids share a row. It is fitted
full-batch in float64 by a few Newton steps per row (``np.bincount`` sums each row's gradient in
a fixed order), so its test AUC is the same on every machine to far more digits than are printed.
Everything a table gets is a mapping ``rows_of`` from raw ids to rows.

Taught in chapter 07 (appendix 07e, ids that collide).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from course_utils.sharding.hashing import collision_rate, hash_ids
from course_utils.workload.metrics import auc

__all__ = ["fit", "logits", "table_rows", "fit_and_score", "bucket_sweep"]


def logits(bias: float, weights: list, rows: np.ndarray) -> np.ndarray:
    """Logits ``[N]`` float64 of ``rows [N, T]``: ``bias + sum_t weights[t][rows[:, t]]``."""
    out = np.full(rows.shape[0], bias)
    for t, w in enumerate(weights):
        out += w[rows[:, t]]
    return out


def fit(rows: np.ndarray, label: np.ndarray, sizes: Sequence[int], *, steps: int = 40, prior: float = 2.0):
    """Fit ``logit = bias + sum_t w_t[rows[:, t]]`` (one number per row of each table, float64).

    rows ``[N, T]`` int64 into tables of ``sizes[t]`` rows; label ``[N]`` 0/1. Each step is a
    Newton step per row (the gradient of a row, summed over the lookups that read it, over its
    diagonal curvature) on the mean log loss plus a ridge ``prior / (2 N) * sum w**2``: a row read by
    few lookups stays near 0 (``prior`` is worth that many lookups). Returns ``(bias, weights)``.
    """
    n = rows.shape[0]
    y = np.asarray(label, dtype=np.float64)
    ridge = prior / n
    bias = float(np.log(y.mean() / (1.0 - y.mean())))
    weights = [np.zeros(int(size)) for size in sizes]
    for _ in range(steps):
        for t in range(len(weights)):  # one table at a time: each step sees the others' last values
            p = 1.0 / (1.0 + np.exp(-logits(bias, weights, rows)))
            grad = np.bincount(rows[:, t], weights=p - y, minlength=sizes[t]) / n + ridge * weights[t]
            curve = np.bincount(rows[:, t], weights=p * (1.0 - p), minlength=sizes[t]) / n + ridge
            weights[t] -= grad / curve
        p = 1.0 / (1.0 + np.exp(-logits(bias, weights, rows)))
        bias -= float(np.mean(p - y) / np.mean(p * (1.0 - p)))
    return bias, weights


def fit_and_score(train_rows, train_label, test_rows, test_label, sizes: Sequence[int], **options) -> float:
    """Test AUC of :func:`fit` on ``train_rows [N, T]``, scored on ``test_rows [M, T]``."""
    bias, weights = fit(np.asarray(train_rows), train_label, sizes, **options)
    return auc(test_label, logits(bias, weights, np.asarray(test_rows)))


def table_rows(rows_of: Sequence, raw: np.ndarray) -> np.ndarray:
    """Rows ``[N, T]`` int64 of raw ids ``[N, T]``: column ``t`` through the mapping ``rows_of[t]``."""
    return np.stack([rows_of[t](raw[:, t]) for t in range(raw.shape[1])], axis=1)


def bucket_sweep(
    train_raw, train_label, test_raw, test_label, buckets: Sequence[int], **options
) -> list[dict]:
    """For each table size in ``buckets``: ``{"buckets", "collision_rate", "auc"}`` of hashed tables.

    train_raw ``[N, T]``, test_raw ``[M, T]``: raw int64 ids; the collision rate is the share of
    test lookups (all tables together) whose row also holds another training id.
    """
    out = []
    for b in buckets:
        mapping = [lambda ids, b=b: hash_ids(ids, b)] * train_raw.shape[1]
        rate = np.mean(
            [collision_rate(train_raw[:, t], test_raw[:, t], mapping[t]) for t in range(train_raw.shape[1])]
        )
        score = fit_and_score(
            table_rows(mapping, train_raw),
            train_label,
            table_rows(mapping, test_raw),
            test_label,
            [b] * train_raw.shape[1],
            **options,
        )
        out.append({"buckets": int(b), "collision_rate": float(rate), "auc": score})
    return out
