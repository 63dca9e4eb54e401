"""How DDP ranks split the data: DistributedSampler and set_epoch, parquet row groups as partitions."""

import numpy as np
import pytest

from course_utils import RankFailedError, launch
from course_utils.ddp import (
    TrainSettings,
    ddp_worker,
    global_batches,
    max_difference,
    rank_batches,
    sampler_indices,
    train_single,
)
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig

pytestmark = [
    pytest.mark.chapter(4),
    pytest.mark.launches,
    pytest.mark.usefixtures("no_garbage_before_fork"),  # tests/conftest.py
]

CARDS = [3, 16, 100, 400]
CONFIG = DLRMConfig(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))


@pytest.fixture(scope="module")
def logs():
    return data.make_click_logs(3000, seed=0, cardinalities=CARDS, n_dense=4)


@pytest.fixture(scope="module")
def parquet_4rg(logs, tmp_path_factory):
    return data.write_parquet(logs, tmp_path_factory.mktemp("pq") / "clicks.parquet", row_groups=4)


def test_distributed_sampler_gives_ranks_disjoint_shares_of_every_row():
    shares = [sampler_indices(1000, r, 4, epoch=0) for r in range(4)]
    assert [len(s) for s in shares] == [250] * 4
    assert sorted(i for s in shares for i in s) == list(range(1000))
    padded = [sampler_indices(10, r, 4, epoch=0) for r in range(4)]  # 10 rows, 4 ranks: 2 repeated
    assert [len(s) for s in padded] == [3] * 4 and set(i for s in padded for i in s) == set(range(10))


def test_without_set_epoch_every_epoch_repeats_the_same_order():
    with_epochs = [sampler_indices(1000, 0, 2, epoch=e) for e in range(3)]
    without = [sampler_indices(1000, 0, 2, epoch=e, set_epoch=False) for e in range(3)]
    assert without[0] == without[1] == without[2]
    assert with_epochs[0] == without[0]  # epoch 0 is the same either way
    assert with_epochs[1] != with_epochs[0] and with_epochs[2] != with_epochs[1]


def test_global_batches_are_the_ranks_batches_side_by_side(logs):
    per_rank = [rank_batches(logs, r, 2, 100, epoch=0) for r in range(2)]
    together = global_batches(logs, 2, 100, epoch=0)
    assert len(together) == len(per_rank[0]) == 15
    assert np.array_equal(
        together[3].label.numpy(),
        np.concatenate([per_rank[0][3].label.numpy(), per_rank[1][3].label.numpy()]),
    )


def test_each_rank_reads_only_its_own_row_groups(logs, parquet_4rg):
    shares = [data.read_parquet(parquet_4rg, r, 2) for r in range(2)]
    assert sum(len(s) for s in shares) == len(logs)
    both = np.concatenate([s.sparse for s in shares])
    assert sorted(map(tuple, both)) == sorted(map(tuple, logs.sparse))
    assert data.row_groups_of_rank(4, 1, 2) == [1, 3]


def test_a_row_group_count_that_does_not_split_fails_on_the_ranks_with_the_fix(logs, tmp_path):
    odd = data.write_parquet(logs, tmp_path / "odd.parquet", row_groups=3)

    def rank_fn():
        rank_batches(odd, 0, 2, 64, epoch=0)

    with pytest.raises(RankFailedError) as failure:
        launch(rank_fn, world_size=2, timeout=60, show_output=False)
    assert "3 row groups" in failure.value.message and "multiple of world_size=2" in failure.value.message
    assert "python -m course_utils.workload.data repartition" in failure.value.message
    fixed = data.repartition(odd, tmp_path / "odd_4rg.parquet", row_groups=4)
    assert data.parquet_info(fixed)["row_groups"] == 4
    assert len(rank_batches(fixed, 1, 2, 64, epoch=0)) == 1500 // 64  # 2 row groups of 750 rows


def test_ddp_from_parquet_partitions_equals_one_process_on_the_same_global_batches(parquet_4rg):
    settings = TrainSettings(global_batch_size=256, epochs=2, optimizer="sgd", lr=0.1)
    ranks = launch(
        ddp_worker,
        "bucketed",
        str(parquet_4rg),
        CONFIG,
        settings,
        world_size=2,
        timeout=120,
        show_output=False,
    )
    single = train_single(str(parquet_4rg), CONFIG, settings, world_size=2)
    assert len(ranks[0].step_loss) == 2 * (1500 // 128)  # full batches of the smaller share
    assert max_difference(ranks[0].state, single.state) < 1e-6
