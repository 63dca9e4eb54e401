"""Appendix 07e: raw ids, hashing and its collisions, the frequency-managed id map, the binned AUC."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.sharding import hashing, id_runs
from course_utils.sharding.managed_collisions import FrequencyRemapper
from course_utils.workload import streaming_auc
from course_utils.workload.data import make_click_logs
from course_utils.workload.data.raw_ids import raw_ids
from course_utils.workload.metrics import auc

pytestmark = pytest.mark.chapter(7)


# -- raw ids -------------------------------------------------------------------------------------
def test_raw_ids_are_a_bijection_per_column_into_63_bits():
    ranks = np.stack([np.arange(1 << 16)] * 3, axis=1)
    raw = raw_ids(ranks)
    assert raw.dtype == np.int64 and raw.min() >= 0  # [0, 2**63)
    for t in range(3):
        assert np.unique(raw[:, t]).size == 1 << 16  # distinct ranks, distinct raw ids
    assert not np.array_equal(raw[:, 0], raw[:, 1])  # each column its own bijection
    assert raw.max() > 1 << 62  # spread over the whole space, not packed near the ranks
    assert np.array_equal(raw_ids(ranks[:, 0]), raw[:, 0])  # [N] is column 0


def test_raw_ids_refuse_negative_or_float_ranks():
    with pytest.raises(ValueError, match=">= 0"):
        raw_ids(np.array([[3, -1]]))
    with pytest.raises(ValueError, match="integer"):
        raw_ids(np.array([[0.5]]))


# -- hashing ------------------------------------------------------------------------------------
def test_hash_ids_spreads_raw_ids_evenly_over_the_buckets():
    raw = raw_ids(np.arange(1 << 16))
    rows = hashing.hash_ids(raw, 64)
    assert rows.min() >= 0 and rows.max() < 64
    counts = np.bincount(rows, minlength=64)
    assert counts.min() > 0.8 * 1024 and counts.max() < 1.2 * 1024  # 1,024 expected per bucket
    high_bits_only = np.arange(64, dtype=np.int64) << 56  # ids that differ in their top bits
    assert np.unique(hashing.hash_ids(high_bits_only, 64)).size > 32


def test_collision_rate_counts_lookups_whose_row_holds_another_training_id():
    parity = lambda ids: np.asarray(ids) % 2  # noqa: E731
    # training ids 1, 3 share row 1; id 2 is alone on row 0
    rate = hashing.collision_rate(np.array([1, 2, 3]), np.array([1, 2, 4, 5]), parity)
    # 1 collides (3 on its row); 2 does not; unseen 4 reads 2's row; unseen 5 reads 1's and 3's
    assert rate == 3 / 4
    vocab = hashing.Vocabulary(np.array([10, 30, 20, 30]))
    assert hashing.collision_rate(np.array([10, 20, 30]), np.array([10, 40, 20]), vocab) == 0.0


def test_vocabulary_gives_each_seen_id_its_own_row_and_unknown_ids_row_0():
    vocab = hashing.Vocabulary(np.array([[50, 7], [7, 1 << 62]]))
    assert len(vocab) == 4 and vocab.map_bytes == 24
    rows = vocab(np.array([7, 50, 1 << 62, 8, 0]))
    assert rows[:3].tolist() == [1, 2, 3] and rows[3:].tolist() == [0, 0]


# -- the frequency-managed map ------------------------------------------------------------------
def test_with_room_for_every_id_the_map_is_injective_and_evicts_nothing():
    rng = np.random.default_rng(0)
    ids = raw_ids(rng.integers(0, 300, 5_000))
    remapper = FrequencyRemapper(512, interval=3)
    for start in range(0, ids.size, 250):
        remapper.profile(ids[start : start + 250])
    remapper.flush()
    distinct = np.unique(ids)
    rows = remapper.remap(distinct)
    assert np.unique(rows).size == distinct.size and rows.max() < 511
    assert remapper.evictions == 0 and remapper.admissions == distinct.size
    assert remapper.remap(np.array([12345]))[0] == remapper.shared_row == 511


def test_one_window_keeps_exactly_the_most_frequent_ids():
    rng = np.random.default_rng(1)
    ids = rng.zipf(1.3, 20_000).astype(np.int64)
    remapper = FrequencyRemapper(101, interval=1)
    remapper.profile(ids)
    values, counts = np.unique(ids, return_counts=True)
    order = np.lexsort((values, -counts))  # by count, then the smaller id, as the map breaks ties
    assert set(remapper.held.tolist()) == set(values[order[:100]].tolist())
    assert remapper.map_bytes == 4 * 8 * 100 and remapper.history_bytes == 0


def test_an_id_that_stops_arriving_is_evicted_and_its_row_reused():
    remapper = FrequencyRemapper(3, interval=1)  # two rows of their own, row 2 shared
    remapper.profile(np.array([10, 10, 20]))
    row_of_20 = int(remapper.remap(np.array([20]))[0])
    remapper.profile(np.array([30, 30, 30, 10]))  # 30 (3 lookups) beats 20 (1)
    assert remapper.evictions == 1 and sorted(remapper.held.tolist()) == [10, 30]
    assert remapper.remap(np.array([30, 20])).tolist() == [row_of_20, 2]
    remapper.profile(np.array([40]))  # a newcomer seen once does not beat held ids seen more
    assert remapper.evictions == 1


def test_remapper_refuses_fewer_than_two_slots():
    with pytest.raises(ValueError, match="slots"):
        FrequencyRemapper(1)


# -- the click model and what collisions cost ---------------------------------------------------
def test_fit_reaches_the_minimum_of_its_objective_per_torch_autograd():
    rng = np.random.default_rng(2)
    rows = rng.integers(0, [5, 7], size=(400, 2))
    label = (rng.random(400) < 0.3).astype(np.float64)
    bias, weights = id_runs.fit(rows, label, [5, 7], steps=200, prior=2.0)
    b = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    w = [torch.tensor(x, requires_grad=True) for x in weights]
    r = torch.from_numpy(rows)
    logit = b + w[0][r[:, 0]] + w[1][r[:, 1]]
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, torch.from_numpy(label))
    loss = loss + 2.0 / (2 * 400) * sum((x**2).sum() for x in w)  # prior / (2 N) * sum w**2
    loss.backward()
    assert max(abs(float(b.grad)), *(float(x.grad.abs().max()) for x in w)) < 1e-9


def test_more_buckets_cost_less_auc_and_the_remap_recovers_the_unhashed_auc():
    logs = make_click_logs(12_288, seed=3, cardinalities=[1 << 16] * 2, n_dense=0)
    train, test = logs[:8_192], logs[8_192:]
    tr, te = raw_ids(train.sparse), raw_ids(test.sparse)
    sweep = id_runs.bucket_sweep(tr, train.label, te, test.label, [16, 256, 4096])
    aucs = [r["auc"] for r in sweep]
    assert aucs[0] < aucs[1] < aucs[2] and sweep[0]["collision_rate"] > sweep[2]["collision_rate"]

    def score(maps, sizes):
        rows = id_runs.table_rows
        return id_runs.fit_and_score(rows(maps, tr), train.label, rows(maps, te), test.label, sizes)

    vocab = [hashing.Vocabulary(tr[:, t]) for t in range(2)]
    unhashed = score(vocab, [len(v) for v in vocab])
    remappers = [FrequencyRemapper(4096, interval=2) for _ in range(2)]
    for start in range(0, len(tr), 512):
        for t, remapper in enumerate(remappers):
            remapper.profile(tr[start : start + 512, t])
    remapped = score(remappers, [4096] * 2)
    assert aucs[0] < unhashed - 0.05 and abs(remapped - unhashed) < 0.005


# -- the binned AUC -----------------------------------------------------------------------------
def test_binned_auc_is_exact_when_every_score_sits_in_its_own_bins_values():
    rng = np.random.default_rng(4)
    scores = (rng.integers(0, 50, 3_000) + 0.5) / 50  # bin centres of 50 bins: ties only within a bin
    labels = (rng.random(3_000) < scores).astype(float)
    histogram = streaming_auc.score_histogram(labels, scores, 50)
    assert streaming_auc.auc_from_histogram(histogram) == pytest.approx(auc(labels, scores), abs=1e-12)


@pytest.mark.parametrize("bins", [10, 100, 1000])
def test_binned_auc_error_is_within_its_bound_and_histograms_add(bins):
    rng = np.random.default_rng(bins)
    labels = (rng.random(20_000) < 0.2).astype(float)
    scores = 1 / (1 + np.exp(-(rng.normal(size=20_000) + 1.2 * labels - 1.5)))
    whole = streaming_auc.score_histogram(labels, scores, bins)
    parts = sum(streaming_auc.score_histogram(labels[i::3], scores[i::3], bins) for i in range(3))
    assert torch.equal(whole, parts) and int(whole.sum()) == 20_000
    error = abs(streaming_auc.auc_from_histogram(whole) - auc(labels, scores))
    assert error <= streaming_auc.binned_error_bound(whole)


def test_binned_auc_agrees_with_torchmetrics_binned_auroc():
    import torchmetrics  # the test extra's

    rng = np.random.default_rng(5)
    labels = (rng.random(10_000) < 0.25).astype(float)
    scores = 1 / (1 + np.exp(-(rng.normal(size=10_000) + labels - 1.0)))
    for bins in (10, 100, 1000):
        metric = torchmetrics.classification.BinaryAUROC(thresholds=bins + 1)  # edges 0, 1/bins, .., 1
        metric.update(torch.from_numpy(scores), torch.from_numpy(labels).long())
        ours = streaming_auc.auc_from_histogram(streaming_auc.score_histogram(labels, scores, bins))
        assert float(metric.compute()) == pytest.approx(ours, abs=1e-6)  # torchmetrics returns float32


def test_score_histogram_names_bad_input():
    with pytest.raises(ValueError, match="sigmoid"):
        streaming_auc.score_histogram([0, 1], [0.5, 1.5], 10)
    with pytest.raises(ValueError, match="one score per label"):
        streaming_auc.score_histogram([0, 1], [0.5], 10)
    with pytest.raises(ValueError, match="both classes"):
        streaming_auc.auc_from_histogram(np.zeros((2, 4), np.int64))


def test_metered_collectives_puts_torch_distributed_back():
    reduce, gather = dist.all_reduce, dist.all_gather
    with pytest.raises(RuntimeError):
        with streaming_auc.metered_collectives():
            assert dist.all_reduce is not reduce
            raise RuntimeError("inside")
    assert dist.all_reduce is reduce and dist.all_gather is gather


def _evaluate(labels, scores, bins, cut):
    from course_utils.workload import global_auc

    mine = slice(0, cut) if dist.get_rank() == 0 else slice(cut, len(labels))  # uneven shares
    with streaming_auc.metered_collectives() as gathered:
        exact = global_auc.distributed_auc(labels[mine], scores[mine])
    with streaming_auc.metered_collectives() as reduced:
        binned, histogram = streaming_auc.binned_auc(labels[mine], scores[mine], bins)
    return exact, binned, gathered["all_gather"], reduced["all_reduce"], histogram


@pytest.mark.launches
def test_bytes_metered_on_ranks_equal_the_formula_and_the_aucs_the_one_process_ones():
    rng = np.random.default_rng(6)
    labels = (rng.random(5_000) < 0.3).astype(float)
    scores = rng.random(5_000)
    results = launch(_evaluate, labels, scores, 200, 2_000, world_size=2, timeout=60)
    histogram = streaming_auc.score_histogram(labels, scores, 200)
    for exact, binned, gathered, reduced, summed in results:
        assert exact == auc(labels, scores) and torch.equal(summed, histogram)
        assert binned == streaming_auc.auc_from_histogram(histogram)
        # the exact gather pads every share to the longest (3,000 rows): 2 ranks x 3,000 x 16 + 2 x 8
        assert gathered == 2 * 8 + 2 * 3_000 * 16 and reduced == 2 * 200 * 8
    assert streaming_auc.evaluation_bytes(6_000, 2, 200) == {"exact": 2 * 8 + 6_000 * 16, "binned": 3_200}
