"""Tests of course_utils.workload.metrics against brute force and PyTorch."""

import itertools
import time

import numpy as np
import pytest
import torch

from course_utils.runtime.timing import Stopwatch
from course_utils.workload.metrics import auc, logloss, throughput

pytestmark = pytest.mark.chapter(1)


def brute_force_auc(labels, scores):
    """Every (clicked, not clicked) pair: 1 if the click scores higher, 1/2 if tied."""
    pos = [s for y, s in zip(labels, scores, strict=False) if y == 1]
    neg = [s for y, s in zip(labels, scores, strict=False) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(20))
def test_auc_matches_brute_force_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    labels = rng.integers(0, 2, n)
    labels[:2] = [0, 1]  # both classes present
    scores = rng.integers(0, 4, n).astype(float)  # only 4 distinct values: ties everywhere
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores), abs=1e-12)


def test_auc_small_and_extreme_cases():
    assert auc([0, 1], [0.1, 0.9]) == 1.0
    assert auc([0, 1], [0.9, 0.1]) == 0.0
    assert auc([0, 1], [0.5, 0.5]) == 0.5
    assert auc([1, 0, 1, 0], [3, 3, 3, 3]) == 0.5  # all tied
    assert auc([0, 0, 1], [0.2, 0.4, 0.3]) == 0.5
    assert auc([1, 1, 0, 0, 0], [2, 1, 1, 0, 1]) == pytest.approx(
        brute_force_auc([1, 1, 0, 0, 0], [2, 1, 1, 0, 1])
    )


def test_auc_ignores_monotone_transforms_and_takes_tensors():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    logits = rng.normal(size=500) + labels
    assert auc(labels, logits) == pytest.approx(auc(labels, 1 / (1 + np.exp(-logits))))
    assert auc(torch.tensor(labels, dtype=torch.float32), torch.tensor(logits)) == pytest.approx(
        auc(labels, logits)
    )


def test_auc_errors_are_clear():
    with pytest.raises(ValueError, match="both classes"):
        auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="both classes"):
        auc([0, 0], [0.1, 0.2])
    with pytest.raises(ValueError, match="rows"):
        auc([0, 1, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="0 or 1"):
        auc([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        auc([0, 1], [0.1, float("nan")])
    with pytest.raises(ValueError, match="one-dimensional"):
        auc(np.zeros((2, 2)), np.zeros((2, 2)))


def test_logloss_matches_torch():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 1000).astype(np.float32)
    probs = rng.uniform(0.01, 0.99, 1000)
    expected = torch.nn.functional.binary_cross_entropy(
        torch.tensor(probs), torch.tensor(labels, dtype=torch.float64)
    )
    assert logloss(labels, probs) == pytest.approx(float(expected), rel=1e-10)


def test_logloss_clips_certain_wrong_answers():
    value = logloss([1, 0], [0.0, 1.0], eps=1e-7)
    assert np.isfinite(value) and value == pytest.approx(-np.log(1e-7), rel=1e-6)
    assert logloss([1, 0], [1.0, 0.0]) < 1e-6
    with pytest.raises(ValueError, match="sigmoid"):
        logloss([1, 0], [2.5, -1.0])  # logits, not probabilities


def test_stopwatch_and_throughput():
    with Stopwatch() as t:
        time.sleep(0.01)
    assert t.seconds >= 0.009 and 0 <= t.cpu_seconds < t.seconds  # sleeping takes no CPU
    with Stopwatch() as busy:
        sum(i * i for i in range(200_000))
    assert busy.cpu_seconds > 0
    assert throughput(100, t.seconds) == pytest.approx(100 / t.seconds)
    assert throughput(1000, 2.0) == 500.0
    with pytest.raises(ValueError, match="positive"):
        throughput(10, 0.0)
