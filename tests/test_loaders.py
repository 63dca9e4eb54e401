"""The loaders the training loop iterates: parquet row groups streamed with a bounded buffer,
the same batches as the in-memory mode, ranks' partitions, set_epoch; and the loop's use of them."""

import numpy as np
import pytest
import torch

from course_utils import launch
from course_utils.ddp import TrainSettings, ddp_worker, max_difference, train_single
from course_utils.workload import data
from course_utils.workload.data import loaders, stream
from course_utils.workload.models import DLRMConfig
from course_utils.workload.train import fit

pytestmark = [
    pytest.mark.chapter(4),
    pytest.mark.launches,
    pytest.mark.usefixtures("no_garbage_before_fork"),  # tests/conftest.py
]

CARDS = [3, 16, 100, 400]
GROUP_ROWS = [126, 125, 125, 125, 125, 125, 125, 124]  # 8 row groups (1000 rows); ranks differ by a row


@pytest.fixture(scope="module")
def logs():
    """1000 rows whose first dense column is the row's number, so that a batch names its rows."""
    logs = data.make_click_logs(1000, seed=0, cardinalities=CARDS, n_dense=4)
    logs.dense[:, 0] = np.arange(1000)
    return logs


def write_groups(logs, path):
    """``logs`` as a parquet file with row groups of ``GROUP_ROWS`` rows."""
    bounds = np.cumsum([0] + GROUP_ROWS)
    return data.write_row_groups((logs[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)), path)


@pytest.fixture(scope="module")
def path(logs, tmp_path_factory):
    path = write_groups(logs, tmp_path_factory.mktemp("pq") / "clicks.parquet")
    assert data.parquet_info(path)["rows_per_group"] == GROUP_ROWS
    return path


def rows_of(batches) -> list:
    return [b.dense[:, 0].long().tolist() for b in batches]


def test_streaming_holds_one_row_group_and_makes_one_batch_at_a_time(path, monkeypatch):
    reads = []
    real = stream.read_row_groups
    monkeypatch.setattr(
        stream, "read_row_groups", lambda pf, groups, cards: reads.append(groups) or real(pf, groups, cards)
    )
    loader = data.ParquetBatches(path, 32, rank=1, world_size=2)
    yielded = 0
    for k, batch in enumerate(loader):
        yielded += len(batch.label)
        assert loader.stats["batches"] == k + 1  # none made ahead of the one yielded
        held = loader.stats["rows_read"] - yielded  # read, not yet handed out
        assert held <= max(GROUP_ROWS) + 32 - 1  # one row group + part of a batch
        assert loader.stats["groups_read"] == len(reads) <= -(-yielded // min(GROUP_ROWS))  # as needed
    assert all(len(g) == 1 for g in reads)  # one row group per read, never the share
    assert sorted(g[0] for g in reads) == [1, 3, 5, 7]
    assert len(loader) == k + 1 == 499 // 32  # full batches of the smaller share


def test_streaming_and_in_memory_give_the_same_batches(path):
    for rank in (0, 1):
        for seed in (0, 5):
            streamed = data.ParquetBatches(path, 50, rank, 2, seed=seed)
            kept = data.ParquetBatches(path, 50, rank, 2, seed=seed, in_memory=True)
            for epoch in (0, 1, 2):
                streamed.set_epoch(epoch)
                kept.set_epoch(epoch)
                a, b = list(streamed), list(kept)
                assert len(a) == len(b) == len(streamed) == 9
                for x, y in zip(a, b, strict=False):
                    assert all(torch.equal(p, q) for p, q in zip(x, y, strict=False))
            assert streamed.stats["groups_read"] == 3 * 4  # every epoch reads its groups again
            assert kept.stats["groups_read"] == 4  # once, then kept


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_resumed_epoch_yields_the_batches_an_uninterrupted_one_would_have_yielded_next(path, in_memory):
    whole = data.ParquetBatches(path, 32, rank=0, world_size=2, seed=3, in_memory=in_memory)
    whole.set_epoch(1)
    expected = rows_of(whole)
    for done in (0, 1, 5, 9, len(expected)):
        resumed = data.ParquetBatches(path, 32, rank=0, world_size=2, seed=3, in_memory=in_memory)
        resumed.set_epoch(1, history=[(2, 32, done)])
        assert rows_of(resumed) == expected[done:] and len(resumed) == len(expected) - done
        if not in_memory and done == 9:  # 9 batches = 288 rows: the first two row groups never read
            assert resumed.stats["groups_read"] == 2


def test_an_epoch_resumed_on_other_numbers_of_ranks_uses_each_row_at_most_once(path):
    """2 ranks x 3 batches of 40, then 4 ranks x 2 batches of 20, then 1 rank to the end: no row twice,
    and only the last layout's leftovers (fewer than a batch per rank... here of one rank) unused."""
    history, seen = [], []
    for world, batch, batches in [(2, 40, 3), (4, 20, 2), (1, 80, None)]:
        loaders = [data.ParquetBatches(path, batch, r, world, seed=1) for r in range(world)]
        for loader in loaders:
            loader.set_epoch(2, history=history)
        taken = [rows_of(loader)[:batches] for loader in loaders]
        assert all(len(t) == (batches or len(loaders[0])) for t in taken)  # every rank steps together
        seen += [row for t in taken for batch_rows in t for row in batch_rows]
        history.append((world, batch, len(taken[0])))
    assert len(seen) == len(set(seen))  # no row used twice
    assert 1000 - len(seen) < 80  # the last rank's leftovers: less than one of its batches
    with pytest.raises(ValueError, match="uses more rows than rank"):
        data.ParquetBatches(path, 40, 0, 2).set_epoch(0, history=[(2, 40, 99)])


def test_ranks_read_disjoint_partitions_of_their_own_row_groups(path):
    bounds = np.cumsum([0] + GROUP_ROWS)
    per_rank = [sum(rows_of(data.ParquetBatches(path, 64, r, 2)), []) for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 7 * 64  # 499 // 64 steps each
    assert not set(per_rank[0]) & set(per_rank[1])
    for rank, rows in enumerate(per_rank):
        groups = {int(np.searchsorted(bounds, row, side="right")) - 1 for row in rows}
        assert groups == set(data.row_groups_of_rank(8, rank, 2))
    with pytest.raises(ValueError, match="not a multiple of world_size=3"):
        data.ParquetBatches(path, 64, 0, 3)  # refused before anything is read


def test_set_epoch_changes_the_order_and_without_it_every_epoch_repeats(path, logs):
    loader = data.ParquetBatches(path, 50, 0, 2)
    first, again = rows_of(loader), rows_of(loader)
    assert first == again  # no set_epoch: epoch 0 again
    loader.set_epoch(1)
    second = rows_of(loader)
    assert second != first
    loader.set_epoch(0)
    assert rows_of(loader) == first
    sampled = data.SampledBatches(logs, 100, 0, 2)
    before = rows_of(sampled)
    sampled.set_epoch(1)
    assert rows_of(sampled) != before


class Spy(loaders.InMemoryBatches):
    def set_epoch(self, epoch):
        self.seen = getattr(self, "seen", []) + [epoch]
        super().set_epoch(epoch)


@pytest.mark.parametrize("set_epoch, seen", [(True, [0, 1, 2]), (False, None)])
def test_fit_tells_the_loader_each_epoch_unless_asked_not_to(logs, set_epoch, seen):
    model = DLRMConfig(CARDS, n_dense=4, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,)).build()
    spy = Spy(logs[:300], 100)
    history = fit(model, spy, torch.optim.SGD(model.parameters(), lr=0.1), epochs=3, set_epoch=set_epoch)
    assert getattr(spy, "seen", None) == seen
    assert len(history.step_loss) == 9 and [e["epoch"] for e in history.epochs] == [1, 2, 3]
    assert history.samples == 900 and len(history.step_seconds) == 9


def test_a_torch_dataloader_over_the_stream_gives_the_same_batches(path):
    loader = data.ParquetBatches(path, 40, 0, 2)
    through_torch = torch.utils.data.DataLoader(loader, batch_size=None)
    assert rows_of(through_torch) == rows_of(loader)


def test_ddp_streaming_equals_in_memory_and_one_process(tmp_path):
    logs = data.make_click_logs(1000, seed=1, cardinalities=CARDS, n_dense=4)  # no row numbers: they
    path = write_groups(logs, tmp_path / "clicks.parquet")  # would make the loss explode
    config = DLRMConfig(CARDS, n_dense=4, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))
    settings = TrainSettings(global_batch_size=128, epochs=2, optimizer="sgd", lr=0.01)
    kept = TrainSettings(global_batch_size=128, epochs=2, optimizer="sgd", lr=0.01, in_memory=True)

    def both():
        return [ddp_worker("torch", str(path), config, s) for s in (settings, kept)]

    streamed, in_memory = launch(both, world_size=2, timeout=120, show_output=False)[0]
    assert max_difference(streamed.state, in_memory.state) == 0.0
    assert streamed.step_loss == in_memory.step_loss and len(streamed.step_loss) == 2 * (499 // 64)
    single = train_single(str(path), config, settings, world_size=2)
    assert max_difference(streamed.state, single.state) < 1e-6
