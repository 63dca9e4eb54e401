"""Checkpoints written in the background (dcp.async_save), the Stateful AppState, a data position
that another number of ranks can resume, and the durable rank-0 save."""

from functools import partial

import pytest
import torch
from torch.utils.data import DistributedSampler

from course_utils import checkpoint, launch
from course_utils.checkpoint.background import Checkpointer, latest_complete, train_big_table
from course_utils.ddp.sparse_tables import BigTableModel

pytestmark = [pytest.mark.chapter(8), pytest.mark.launches]

SMALL = dict(rows=1000, dim=8, global_batch=64, samples=512)  # 8 steps an epoch


@pytest.mark.parametrize("world", [1, 2, 4])
def test_global_position_deals_like_distributed_sampler(world):
    for rank in range(world):
        ours = checkpoint.GlobalPositionSampler(100, seed=7, rank=rank, world_size=world)
        torch_sampler = DistributedSampler(range(100), num_replicas=world, rank=rank, seed=7, drop_last=True)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            torch_sampler.set_epoch(epoch)
            assert list(ours) == list(torch_sampler), (world, rank, epoch)


@pytest.mark.parametrize("new_world", [1, 3, 4])
def test_a_new_world_size_resumes_without_skipping_or_repeating(new_world):
    before = [checkpoint.GlobalPositionSampler(96, seed=1, rank=r, world_size=2) for r in range(2)]
    seen = []
    for sampler in before:
        seen += list(sampler)[:10]  # 10 samples each, then the job stops
        sampler.advance(10)
    state = before[0].state_dict()
    assert state == before[1].state_dict() == {"epoch": 0, "samples_seen": 20}
    for rank in range(new_world):
        after = checkpoint.GlobalPositionSampler(96, seed=1, rank=rank, world_size=new_world)
        after.load_state_dict(state)
        seen += list(after)
    assert len(seen) == len(set(seen))  # nothing twice
    assert len(seen) == 96 - (96 - 20) % new_world  # nothing skipped but the drop_last tail


def test_global_position_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one sample"):
        checkpoint.GlobalPositionSampler(0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="not in range"):
        checkpoint.GlobalPositionSampler(10, rank=2, world_size=2)


def test_checkpointer_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="'blocking' or 'async'"):
        Checkpointer(tmp_path, "later")
    with pytest.raises(ValueError, match="keep must be at least 1"):
        Checkpointer(tmp_path, "async", keep=0)
    assert latest_complete(tmp_path) is None


def _run(folder, world=2, **options):
    return launch(partial(train_big_table, folder, **SMALL, **options), world_size=world, timeout=120)


def test_two_ranks_train_the_weights_one_process_trains(tmp_path):
    """DDP averages the head's gradients, average_sparse_gradient the table's: each step is the
    one-process step on the same 64 samples (the ranks' round-robin shares), up to rounding."""
    one = _run(tmp_path / "one", world=1, steps=6)[0]["weights"]
    two = _run(tmp_path / "two", world=2, steps=6)[0]["weights"]
    assert one.keys() == two.keys() == {"table.weight", "head.weight", "head.bias"}
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=name)
    assert not torch.equal(one["table.weight"], BigTableModel(1000, 8).table.weight.detach())  # it trained


def test_resume_from_an_async_checkpoint_is_bit_identical(tmp_path):
    straight = _run(tmp_path / "straight", steps=20)
    stopped = _run(tmp_path / "async", steps=20, checkpoint_every=4, mode="async", stop_after=14)
    assert [len(r["stalls"]) for r in stopped] == [3, 3]  # steps 4, 8, 12
    assert latest_complete(tmp_path / "async").name == "step_000012"
    assert sorted(p.name for p in (tmp_path / "async").iterdir()) == ["step_000012"]  # keep=1
    resumed = _run(tmp_path / "async", steps=20, checkpoint_every=4, mode="async", resume=True)
    assert [r["started_at"] for r in resumed] == [12, 12]
    assert straight[0]["weights"].keys() == resumed[0]["weights"].keys()
    want, got = straight[0]["weights"], resumed[0]["weights"]
    assert all(torch.equal(want[k], got[k]) for k in want)
    # steps 13 and 14 ran twice; every other step once, each on the same samples
    assert stopped[0]["seen"][: 12 * 32] + resumed[0]["seen"] == straight[0]["seen"]


def test_blocking_and_async_checkpoints_hold_the_same_state(tmp_path):
    def saved(folder):
        import torch.distributed.checkpoint as dcp

        reader = dcp.FileSystemReader(str(latest_complete(folder)))
        names = reader.read_metadata().state_dict_metadata
        tensors = {k: m for k, m in names.items() if hasattr(m, "size")}
        state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in tensors.items()}
        dcp.load(state, storage_reader=reader, no_dist=True)
        return state

    for mode in ("blocking", "async"):
        _run(tmp_path / mode, steps=6, checkpoint_every=6, mode=mode)
    blocking, background = saved(tmp_path / "blocking"), saved(tmp_path / "async")
    assert "app.model.table.weight" in blocking  # get_state_dict: no "module." from DDP
    assert "app.optimizer.state.table.weight.sum" in blocking  # optimizer state keyed by name
    assert blocking.keys() == background.keys()
    assert all(torch.equal(blocking[k], background[k]) for k in blocking)


@pytest.mark.parametrize("new_world", [1, 4])
def test_world_size_change_sees_every_sample_once(tmp_path, new_world):
    first = _run(tmp_path, steps=8, checkpoint_every=3, stop_after=3)  # 3 of the epoch's 8 steps
    then = _run(tmp_path, world=new_world, steps=8, checkpoint_every=3, resume=True)
    seen = [i for r in first for i in r["seen"]] + [i for r in then for i in r["seen"]]
    assert sorted(seen) == list(range(512))


def test_save_on_rank0_syncs_the_file_and_its_folder(tmp_path):
    def save():
        import os

        synced = []
        real = os.fsync
        os.fsync = lambda fd: (synced.append(fd), real(fd))[1]
        try:
            checkpoint.save_on_rank0({"w": torch.ones(3)}, tmp_path / "c.pt")
        finally:
            os.fsync = real
        return len(synced)

    assert launch(save, world_size=2, timeout=60) == [2, 0]  # rank 0: the file, then the folder
    assert torch.equal(torch.load(tmp_path / "c.pt", weights_only=True)["w"], torch.ones(3))
    assert not (tmp_path / "c.pt.tmp").exists()
