"""Tests of course_utils.workload.data: synthetic logs, the container, parquet shards (the Criteo
format: test_criteo.py)."""

import hashlib
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from course_utils.workload import data
from course_utils.workload.metrics import auc

pytestmark = pytest.mark.chapter(1)

SMALL_CARDS = [3, 10, 100, 1000]


def fingerprint(logs: data.ClickLogs) -> str:
    """sha256 of the ids, the labels and the dense values rounded to 3 decimals."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(logs.sparse, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(logs.label, dtype="<f4").tobytes())
    h.update(np.rint(logs.dense.astype(np.float64) * 1000).astype("<i8").tobytes())
    return h.hexdigest()


# --- determinism ------------------------------------------------------------------


def test_golden_fingerprint_is_the_same_on_every_machine():
    """ "Same data for the same seed on any machine" means exactly this: these
    hashes were computed once and must come out again on any OS, CPU, thread
    count and numpy build with the same PCG64 stream. Ids, counts and the
    uniform draws behind labels use integer arithmetic only; a label could
    differ only if its draw fell within ~1e-16 of its probability (whose exp may
    differ in the last bit between math libraries), and dense values are
    rounded to 3 decimals for the same reason.
    If this fails after a deliberate change of the generator, every stored
    notebook output that shows data changes too: regenerate them, then update
    these values."""
    logs = data.make_click_logs(5000, seed=123)
    assert fingerprint(logs) == "06da9d37ff6ddd38a0a597d9b83882bf1a1b893b5842d7cf2048660885df2333"
    assert int(logs.label.sum()) == 992
    big = data.make_click_logs(3000, seed=7, cardinalities=data.CRITEO_KAGGLE_CARDINALITIES, first_row=65000)
    assert fingerprint(big) == "dbbce234baf27f28364b002a90e77191a38cb3b0e25cd9ea415efafdb1ec4fe7"


def test_same_seed_same_rows_different_seed_different_rows():
    a = data.make_click_logs(2000, seed=1)
    b = data.make_click_logs(2000, seed=1)
    c = data.make_click_logs(2000, seed=2)
    assert fingerprint(a) == fingerprint(b)
    np.testing.assert_array_equal(a.prob, b.prob)
    assert fingerprint(a) != fingerprint(c)
    assert (a.sparse != c.sparse).mean() > 0.3


def test_rows_do_not_depend_on_how_many_are_made():
    """Row i is the same whether made alone or in a bigger batch, across block edges."""
    whole = data.make_click_logs(data.BLOCK_ROWS + 500, seed=3, cardinalities=SMALL_CARDS)
    part = data.make_click_logs(1000, seed=3, cardinalities=SMALL_CARDS, first_row=data.BLOCK_ROWS - 500)
    assert fingerprint(part) == fingerprint(whole[data.BLOCK_ROWS - 500 :])
    assert fingerprint(data.make_click_logs(10, seed=3, cardinalities=SMALL_CARDS)) == fingerprint(whole[:10])


def test_row_seed_changes_rows_but_not_the_world():
    """Train and test sets drawn with different seeds follow the same click model."""
    model = data.PlantedClickModel()
    for seed in (0, 1):
        logs = data.make_click_logs(500, seed=seed, cardinalities=SMALL_CARDS, n_dense=4)
        counts = np.rint(np.expm1(logs.dense.astype(np.float64))).astype(np.int64)
        logit = model.logit(counts, logs.sparse, SMALL_CARDS)
        np.testing.assert_allclose(1 / (1 + np.exp(-logit)), logs.prob, rtol=1e-5, atol=1e-6)


# --- shape of the data ---------------------------------------------------------------


def test_shapes_dtypes_and_ranges():
    logs = data.make_click_logs(3000, seed=0)
    assert logs.dense.shape == (3000, 13) and logs.dense.dtype == np.float32
    assert logs.sparse.shape == (3000, 26) and logs.sparse.dtype == np.int64
    assert logs.label.dtype == np.float32 and set(np.unique(logs.label)) <= {0.0, 1.0}
    assert logs.prob.dtype == np.float32 and ((logs.prob > 0) & (logs.prob < 1)).all()
    assert logs.cardinalities == tuple(data.criteo_cardinalities(1 / 1000))
    assert (logs.sparse >= 0).all() and (logs.sparse < np.array(logs.cardinalities)).all()
    assert (logs.dense >= 0).all()
    custom = data.make_click_logs(100, seed=0, cardinalities=[5, 7], n_dense=3)
    assert custom.dense.shape == (100, 3) and custom.sparse.shape == (100, 2)


def test_dense_counts_are_heavy_tailed_with_zeros():
    logs = data.make_click_logs(20000, seed=0)
    counts = np.expm1(logs.dense.astype(np.float64))
    assert np.allclose(counts, np.rint(counts), atol=1e-2 * np.maximum(counts, 1))  # whole counts
    big = counts[:, 4]  # the widest column: counts up to 2**17
    assert np.percentile(big, 99) > 20 * np.median(big)
    assert 0.3 < (counts[:, 0] == 0).mean() < 0.6


def test_ids_are_zipf_like():
    card = 1 << 12
    ids = data.make_click_logs(50000, seed=0, cardinalities=[card], n_dense=1).sparse[:, 0]
    freq = np.bincount(ids, minlength=card)
    assert freq[0] == freq.max()
    # P(id) ~ 1/(id+1): each octave of ids carries about the same share of rows.
    octave_share = [freq[(1 << k) - 1 : (1 << (k + 1)) - 1].sum() / len(ids) for k in range(12)]
    assert max(octave_share) / min(octave_share) < 1.3
    assert freq[:16].sum() > 0.3 * len(ids) and freq[2048:].mean() < 0.01 * freq[0]


def test_ctr_and_calibration():
    logs = data.make_click_logs(40000, seed=0)
    assert 0.18 < logs.ctr < 0.22
    assert abs(logs.prob.mean() - logs.ctr) < 0.01
    bins = np.digitize(logs.prob, [0.1, 0.3, 0.5])
    for b in range(4):  # labels follow the returned probability within each bin
        rows = bins == b
        assert abs(logs.label[rows].mean() - logs.prob[rows].mean()) < 0.03
    rare = data.make_click_logs(40000, seed=0, planted=data.PlantedClickModel(ctr=0.05))
    assert 0.04 < rare.ctr < 0.06


def test_bayes_auc_is_auc_of_the_true_probability():
    logs = data.make_click_logs(20000, seed=0)
    assert logs.bayes_auc() == pytest.approx(auc(logs.label, logs.prob))
    assert data.bayes_auc(logs) == logs.bayes_auc()
    assert 0.75 < logs.bayes_auc() < 0.9
    no_signal = data.make_click_logs(
        20000,
        seed=0,
        planted=data.PlantedClickModel(dense_strength=0, category_strength=0, interaction_strength=0),
    )
    assert abs(no_signal.bayes_auc() - 0.5) < 0.02


def test_huge_cardinalities_are_fast_and_small_in_memory():
    start = time.perf_counter()
    logs = data.make_click_logs(20000, seed=0, cardinalities=[40_000_000] * 26)
    assert time.perf_counter() - start < 20  # generous: proves nothing of size 40M is built
    params = data.PlantedClickModel().parameters([40_000_000] * 26, 13)
    assert max(len(e) for e in params["effect"]) <= 1 << 14
    assert logs.sparse.max() > 1_000_000


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="cardinalities"):
        data.make_click_logs(10, cardinalities=[10, 0])
    with pytest.raises(ValueError, match="n_rows"):
        data.make_click_logs(-1)
    with pytest.raises(ValueError, match="source"):
        data.criteo_cardinalities(source="movielens")
    with pytest.raises(ValueError, match="ctr"):
        data.PlantedClickModel(ctr=1.5)


def test_criteo_cardinalities_scale():
    full = data.criteo_cardinalities()
    assert full == list(data.CRITEO_KAGGLE_CARDINALITIES)
    small = data.criteo_cardinalities(1 / 1000)
    assert max(small) == 10131 and min(small) == 3 and len(small) == 26
    assert data.criteo_cardinalities(1.0, source="1tb")[0] == 39884406
    assert data.CRITEO_1TB_ROWS == 4_373_472_329 and data.CRITEO_1TB_TRAIN_ROWS == 4_195_197_692


# --- the container -----------------------------------------------------------------------


def test_slicing_split_concat():
    logs = data.make_click_logs(1000, seed=0, cardinalities=SMALL_CARDS)
    assert len(logs[:10]) == 10 and len(logs[np.arange(5)]) == 5 and len(logs[3]) == 1
    train, test = logs.split(0.8)
    assert (len(train), len(test)) == (800, 200)
    again = data.ClickLogs.concat([train, test])
    assert fingerprint(again) == fingerprint(logs)
    with pytest.raises(ValueError, match="fraction"):
        logs.split(1.0)


def test_to_torch_and_pandas_round_trip():
    logs = data.make_click_logs(100, seed=0, cardinalities=SMALL_CARDS, n_dense=3)
    b = logs.to_torch()
    assert b.dense.dtype == torch.float32 and b.sparse.dtype == torch.int64 and b.label.shape == (100,)
    df = logs.to_pandas()
    assert list(df.columns) == ["label", "prob", "I1", "I2", "I3", "C1", "C2", "C3", "C4"]
    back = data.ClickLogs.from_pandas(df, logs.cardinalities)
    assert fingerprint(back) == fingerprint(logs)
    np.testing.assert_array_equal(back.prob, logs.prob)


def test_batches_cover_every_row_once_and_shuffle_deterministically():
    logs = data.make_click_logs(1000, seed=0, cardinalities=SMALL_CARDS)
    plain = list(data.batches(logs, 300))
    assert [len(b.label) for b in plain] == [300, 300, 300, 100]
    assert torch.equal(plain[0].sparse, torch.from_numpy(logs.sparse[:300]))
    shuffled = list(logs.batches(300, shuffle=True, seed=5))
    rows = np.concatenate([b.sparse.numpy() for b in shuffled])
    assert sorted(map(tuple, rows)) == sorted(map(tuple, logs.sparse))
    assert not np.array_equal(rows, logs.sparse)
    again = list(logs.batches(300, shuffle=True, seed=5))
    assert all(torch.equal(x.dense, y.dense) for x, y in zip(shuffled, again, strict=False))
    assert [len(b.label) for b in logs.batches(300, drop_last=True)] == [300, 300, 300]


# --- parquet -------------------------------------------------------------------------------


def test_parquet_round_trip_with_row_groups(tmp_path):
    logs = data.make_click_logs(1003, seed=0, cardinalities=SMALL_CARDS)
    path = data.write_parquet(logs, tmp_path / "clicks.parquet", row_groups=6)
    info = data.parquet_info(path)
    assert info["rows"] == 1003 and info["row_groups"] == 6
    assert info["cardinalities"] == tuple(logs.cardinalities)
    assert max(info["rows_per_group"]) - min(info["rows_per_group"]) <= 1
    back = data.read_parquet(path)
    assert back.cardinalities == logs.cardinalities and fingerprint(back) == fingerprint(logs)


@pytest.mark.parametrize("world_size", [1, 2, 3, 6])
def test_each_rank_reads_whole_row_groups_and_ranks_cover_the_file(tmp_path, world_size):
    logs = data.make_click_logs(600, seed=0, cardinalities=SMALL_CARDS)
    path = data.write_parquet(logs, tmp_path / "clicks.parquet", row_groups=6)
    shares = [data.read_parquet(path, rank=r, world_size=world_size) for r in range(world_size)]
    assert all(len(s) == 600 // world_size for s in shares)
    for r, share in enumerate(shares):  # rank r reads groups r, r + world_size, ... (100 rows each)
        expected = np.concatenate([logs.sparse[g * 100 : (g + 1) * 100] for g in range(r, 6, world_size)])
        np.testing.assert_array_equal(share.sparse, expected)


def test_row_groups_not_a_multiple_of_world_size_is_a_clear_error(tmp_path):
    logs = data.make_click_logs(600, seed=0, cardinalities=SMALL_CARDS)
    path = data.write_parquet(logs, tmp_path / "clicks.parquet", row_groups=6)
    with pytest.raises(ValueError) as err:
        data.read_parquet(path, rank=0, world_size=4)
    msg = str(err.value)
    assert "6 row groups" in msg and "world_size=4" in msg
    assert "course_utils.workload.data.repartition(" in msg and "row_groups=8" in msg
    assert "python -m course_utils.workload.data repartition" in msg
    with pytest.raises(ValueError, match="rank"):
        data.read_parquet(path, rank=2, world_size=2)


def test_repartition_keeps_rows_and_order(tmp_path):
    logs = data.make_click_logs(600, seed=0, cardinalities=SMALL_CARDS)
    src = data.write_parquet(logs, tmp_path / "a.parquet", row_groups=6)
    dst = data.repartition(src, tmp_path / "b.parquet", row_groups=8)
    assert data.parquet_info(dst)["row_groups"] == 8
    assert fingerprint(data.read_parquet(dst)) == fingerprint(logs)
    assert len(data.read_parquet(dst, rank=3, world_size=4)) == 150
    with pytest.raises(ValueError, match="row_groups"):
        data.write_parquet(logs, tmp_path / "c.parquet", row_groups=0)


@pytest.mark.launches
def test_repartition_command_line(tmp_path):
    logs = data.make_click_logs(100, seed=0, cardinalities=SMALL_CARDS)
    src = data.write_parquet(logs, tmp_path / "a.parquet", row_groups=3)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_utils.workload.data",
            "repartition",
            str(src),
            str(tmp_path / "b.parquet"),
            "4",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert data.parquet_info(tmp_path / "b.parquet")["row_groups"] == 4
