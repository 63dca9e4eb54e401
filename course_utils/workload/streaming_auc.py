"""AUC at scale: a histogram of scores per rank, one all-reduce, a fixed size whatever the rows.

The exact AUC (``global_auc.py``) gathers every ``(label, score)`` pair to every rank: 16 bytes a
row, so MLPerf's test half of Criteo's day 23 (89 M rows) puts 1.4 GB on every rank at each
evaluation. A *binned* AUC keeps, on each rank, how many clicks and non-clicks scored in each of
``bins`` equal slices of ``[0, 1]``: a ``[2, bins]`` int64 histogram, updated batch by batch
(streaming: no score is kept). One all-reduce sums the ranks' histograms; the AUC follows from the
sum, every pair of rows in different bins ordered exactly, every pair in one bin counted one half:

    AUC_binned = sum_b pos_b * (neg_0 + .. + neg_{b-1} + neg_b / 2) / (P * N)

Only pairs within one bin can be wrong, and each by at most one half, so
``|AUC_binned - AUC_exact| <= sum_b pos_b * neg_b / (2 P N)`` (:func:`binned_error_bound`), a
bound read from the same histogram.

What libraries do: ``torchmetrics``' ``BinaryAUROC(thresholds=n)`` keeps a ``[n, 2, 2]`` int64
confusion matrix per threshold (``dist_reduce_fx="sum"``: one all-reduce of ``32 n`` bytes) and
integrates the curve by trapezoids, which counts a bin's pairs one half as here;
``thresholds=None`` keeps every score (``dist_reduce_fx="cat"``: a gather). TorchRec's
``AUCMetric`` (``torchrec/metrics/auc.py``) is exact over a window: each rank keeps its last
``window_size`` predictions, labels and weights (float64), the states are concatenated across
ranks, and the AUC is the trapezoid of the sorted cumulative counts.

Taught in chapter 07 (appendix 07e, evaluation at scale).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist

from course_utils.runtime.checks import check_whole
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.taps import tap_collectives

__all__ = [
    "score_histogram",
    "auc_from_histogram",
    "binned_error_bound",
    "binned_auc",
    "metered_collectives",
    "evaluation_bytes",
]


def score_histogram(labels, scores, bins: int) -> torch.Tensor:
    """``[2, bins]`` int64: row 0 counts non-clicks, row 1 clicks, per equal slice of ``[0, 1]``.

    labels ``[N]`` 0/1; scores ``[N]`` probabilities in ``[0, 1]`` (``sigmoid`` of the logits).
    Histograms of two parts of the rows add up to the histogram of all of them.
    """
    check_whole("bins", bins)
    y = torch.as_tensor(np.asarray(labels, dtype=np.float64)).reshape(-1)
    s = torch.as_tensor(np.asarray(scores, dtype=np.float64)).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels has {y.numel()} rows but scores has {s.numel()}; pass one score per label.")
    if s.numel() and (torch.isnan(s).any() or s.min() < 0 or s.max() > 1):
        raise ValueError("scores must be probabilities in [0, 1] (no NaN); pass torch.sigmoid(logits).")
    which = torch.clamp((s * bins).to(torch.int64), max=bins - 1)  # bin b holds [b/bins, (b+1)/bins)
    return torch.bincount(which + bins * (y > 0.5).to(torch.int64), minlength=2 * bins).reshape(2, bins)


def auc_from_histogram(histogram) -> float:
    """The binned AUC of a ``[2, bins]`` histogram (pairs in one bin count one half)."""
    neg, pos = (np.asarray(histogram, dtype=np.int64)[i].astype(np.float64) for i in (0, 1))
    n_pos, n_neg = pos.sum(), neg.sum()
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes; the histogram has no clicks or no non-clicks.")
    below = np.cumsum(neg) - neg  # non-clicks in lower bins
    return float(np.sum(pos * (below + 0.5 * neg)) / (n_pos * n_neg))


def binned_error_bound(histogram) -> float:
    """Largest ``|AUC_binned - AUC_exact|``: half the share of (click, non-click) pairs in one bin."""
    neg, pos = (np.asarray(histogram, dtype=np.int64)[i].astype(np.float64) for i in (0, 1))
    return float(0.5 * np.sum(pos * neg) / (pos.sum() * neg.sum()))


def binned_auc(labels, scores, bins: int = 10_000, group=None) -> tuple[float, torch.Tensor]:
    """``(AUC, histogram [2, bins])`` of every rank's rows: each rank's histogram, one all-reduce.

    Every rank of ``group`` calls it with its own ``labels [n_r]`` and ``scores [n_r]``.
    """
    histogram = score_histogram(labels, scores, bins).to(rank_device())
    dist.all_reduce(histogram, group=group)  # [2, bins] int64: 16 bytes a bin, whatever the rows
    histogram = histogram.cpu()
    return auc_from_histogram(histogram), histogram


@contextlib.contextmanager
def metered_collectives():
    """Count the bytes of every ``dist.all_reduce`` and ``dist.all_gather`` called inside
    (``runtime.taps.tap_collectives``).

    Yields a dict ``{op: bytes}``, filled when the block ends: for an all-reduce the tensor
    reduced, for an all-gather the tensors gathered (what every rank holds afterwards, its own
    part included). ``torch.distributed`` is put back after the block.
    """
    totals = {}
    with tap_collectives(all_reduce=[], all_gather=[]) as sizes:
        yield totals
    totals.update({op: sum(calls) for op, calls in sizes.items()})


def evaluation_bytes(rows: int, world_size: int, bins: int) -> dict:
    """Bytes each rank holds after one evaluation's collectives, by formula.

    ``exact``: ``gather_predictions``' two all-gathers, the row counts (8 bytes a rank) and every
    rank's ``[2, longest]`` float64 share padded to the longest (``ceil(rows / world_size)`` when
    the rows are spread evenly); ``binned``: the ``[2, bins]`` int64 histogram.
    """
    check_whole("world_size", world_size)
    longest = -(-rows // world_size)
    return {"exact": 8 * world_size + 16 * longest * world_size, "binned": 16 * bins}
