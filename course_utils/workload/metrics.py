"""Metrics for click prediction: exact AUC (ties handled), log loss, throughput.

All functions take numpy arrays or torch tensors of shape ``[N]``:
``labels`` are 0/1 (clicked or not), ``scores`` any real numbers whose order
matters (logits or probabilities), ``probs`` probabilities in [0, 1]. The seconds
that ``throughput`` divides by come from ``course_utils.runtime.timing.Stopwatch``.

Taught in chapter 01.
"""

from __future__ import annotations

import numpy as np

__all__ = ["auc", "logloss", "scores", "throughput"]


def _as_1d_float64(x, name: str) -> np.ndarray:
    """A ``[N]`` float64 numpy copy of ``x`` (numpy array, list or torch tensor)."""
    if hasattr(x, "detach"):  # torch tensor, on any device
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be one-dimensional [N], got shape {arr.shape}; "
            f"flatten it first (e.g. {name}.reshape(-1))."
        )
    return arr


def _check_labels_and_scores(labels, scores, scores_name: str):
    y = _as_1d_float64(labels, "labels")
    s = _as_1d_float64(scores, scores_name)
    if y.shape != s.shape:
        raise ValueError(
            f"labels has {y.shape[0]} rows but {scores_name} has {s.shape[0]}; pass one score per label."
        )
    if y.size and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][:3]
        raise ValueError(f"labels must be 0 or 1, found {bad.tolist()}; threshold or map them to 0/1 first.")
    if np.isnan(s).any():
        raise ValueError(
            f"{scores_name} contains NaN ({int(np.isnan(s).sum())} of {s.size}); "
            "the model diverged or the input had missing values."
        )
    return y, s


def auc(labels, scores) -> float:
    """Exact area under the ROC curve, ties counted one half.

    The Mann-Whitney form: the probability that a random clicked row scores
    higher than a random non-clicked row, ``P(s+ > s-) + 0.5 * P(s+ == s-)``.
    Computed in ``O(N log N)`` from average ranks (tied scores share the mean
    of the ranks they span).

    labels: ``[N]`` 0/1.  scores: ``[N]`` real numbers (only their order matters).
    """
    y, s = _check_labels_and_scores(labels, scores, "scores")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        only = "1s (clicks)" if n_neg == 0 else "0s (no clicks)"
        raise ValueError(
            f"AUC needs both classes, but all {y.size} labels are {only}; "
            "evaluate on more rows or a different slice."
        )
    order = np.argsort(s, kind="mergesort")
    sorted_scores = s[order]
    # Tie groups: [start, end) runs of equal scores in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], s.size]
    mean_rank = (starts + ends + 1) / 2.0  # ranks are 1-based: mean of start+1 .. end
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    rank_sum_pos = ranks[y == 1.0].sum()
    u = rank_sum_pos - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def logloss(labels, probs, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities, clipped to ``[eps, 1 - eps]``.

    labels: ``[N]`` 0/1.  probs: ``[N]`` click probabilities (not logits).
    """
    y, p = _check_labels_and_scores(labels, probs, "probs")
    if y.size == 0:
        raise ValueError("logloss of zero rows is undefined; pass at least one row.")
    if p.min() < 0.0 or p.max() > 1.0:
        raise ValueError(
            f"probs must lie in [0, 1], found range [{p.min():.3g}, {p.max():.3g}]; "
            "pass torch.sigmoid(logits), not the logits."
        )
    p = np.clip(p, eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def scores(labels, probs) -> dict:
    """``{"auc": .., "logloss": ..}`` of predicted click probabilities against 0/1 labels."""
    return {"auc": auc(labels, probs), "logloss": logloss(labels, probs)}


def throughput(samples: int, seconds: float) -> float:
    """Samples per second; raises on a non-positive duration."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}; time a longer run.")
    return samples / seconds
