"""Checkpoint and resume: a resumed run continues bit for bit like an uninterrupted one
(rank-0 torch.save for replicated DDP state, torch.distributed.checkpoint for sharded state)."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from course_utils import checkpoint, launch
from course_utils.ddp import settle_ddp_buckets
from course_utils.sharding import hybrid
from course_utils.workload import data
from course_utils.workload.data import Batch
from course_utils.workload.models import DLRM, DLRMConfig
from course_utils.workload.train import make_optimizer, train_step

pytestmark = pytest.mark.chapter(8)

CARDS = data.criteo_cardinalities(1 / 1000)
LOGS = data.make_click_logs(2048, seed=4, cardinalities=CARDS)


def test_resumable_sampler_skips_exactly_what_was_consumed():
    dataset = list(range(40))
    whole = checkpoint.ResumableSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
    whole.set_epoch(2)
    order = list(whole)
    resumed = checkpoint.ResumableSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
    resumed.load_state_dict({"epoch": 2, "consumed": 6})
    resumed.set_epoch(2)  # the same epoch: keeps its place
    assert list(resumed) == order[6:] and len(resumed) == 14
    resumed.set_epoch(3)  # a new epoch starts from its beginning
    assert len(list(resumed)) == 20 and resumed.state_dict() == {"epoch": 3, "consumed": 0}


def _ddp_run(path, stop_after, resume):
    """DDP DLRM, 2 epochs of 4 steps; optionally save at `stop_after` and return, or resume first."""
    dataset = TensorDataset(*(torch.from_numpy(a) for a in (LOGS.dense, LOGS.sparse, LOGS.label)))
    sampler = checkpoint.ResumableSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=256, sampler=sampler, drop_last=True)
    model = DDP(DLRM(CARDS, seed=0))
    settle_ddp_buckets(model, torch.zeros(1, 13), torch.zeros(1, len(CARDS), dtype=torch.long))
    opt = make_optimizer(model, "adam", 1e-2)
    step = 0
    if resume:
        step = checkpoint.restore_training_state(checkpoint.load_on_every_rank(path), model, opt, sampler)
    for epoch in range(sampler.epoch, 2):
        sampler.set_epoch(epoch)
        for dense, sparse, label in loader:
            train_step(model, opt, Batch(dense, sparse, label))
            sampler.advance(len(label))
            step += 1
            if step == stop_after:
                checkpoint.save_on_rank0(checkpoint.training_state(model, opt, sampler, step), path)
                return None
    return {k: v.clone() for k, v in model.module.state_dict().items()}, {
        k: v.clone() for k, v in opt.state[next(model.parameters())].items()
    }


@pytest.mark.launches
@pytest.mark.parametrize("stop_after", [5])  # an epoch is 4 steps: stop inside the second
def test_rank0_checkpoint_resume_is_bit_identical(tmp_path, stop_after):
    path = tmp_path / "checkpoint.pt"
    straight = launch(_ddp_run, path, -1, False, world_size=2, timeout=120)
    assert launch(_ddp_run, path, stop_after, False, world_size=2, timeout=120) == [None, None]
    assert path.exists() and not (tmp_path / "checkpoint.pt.tmp").exists()
    resumed = launch(_ddp_run, path, -1, True, world_size=2, timeout=120)
    for (weights, adam), (weights2, adam2) in zip(straight, resumed, strict=False):
        assert weights.keys() == weights2.keys() and all(
            torch.equal(weights[k], weights2[k]) for k in weights
        )
        assert all(torch.equal(adam[k], adam2[k]) for k in adam)  # Adam's moments and step count


def _hybrid_run(kind, source, path, mode):
    """Hybrid DLRM, 8 steps; mode "save" stops at step 4 with a DCP checkpoint, "resume" starts there."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = hybrid.HybridDLRM(source, kind)
    opt = make_optimizer(model, "adam", 1e-2)
    start = checkpoint.load_sharded(model, opt, path)["step"] if mode == "resume" else 0
    for step, batch in enumerate(LOGS.batches(256, shuffle=True, seed=0)):
        if step < start:
            continue
        if mode == "save" and step == 4:
            checkpoint.save_sharded(model, opt, path, {"step": 4})
            break
        train_step(model, opt, hybrid.local_rows(batch, rank, world))
    state = checkpoint.sharded_state_dict(model, opt)
    return {k: (v.to_local() if hasattr(v, "to_local") else v).clone() for k, v in state.items()}, [
        (s, w.detach().clone())
        for s, w in zip(model.embeddings.shards, model.embeddings.weights, strict=False)
    ]


def _resume_check(tmp_path, kind, world):
    straight = launch(
        _hybrid_run, kind, DLRM(CARDS, seed=0), tmp_path, "straight", world_size=world, timeout=120
    )
    saved = launch(_hybrid_run, kind, DLRM(CARDS, seed=0), tmp_path, "save", world_size=world, timeout=120)
    # a fresh model from the config: every value it ends with must come from the checkpoint
    resumed = launch(
        _hybrid_run, kind, DLRMConfig(tuple(CARDS)), tmp_path, "resume", world_size=world, timeout=120
    )
    for (state, _), (state2, _) in zip(straight, resumed, strict=False):
        assert state.keys() == state2.keys() and any("exp_avg_sq" in k for k in state)
        assert all(torch.equal(state[k], state2[k]) for k in state), kind
    # the checkpoint read whole by one process, without a process group: the tables at step 4
    tables = checkpoint.load_full_tables(tmp_path, CARDS, 16)
    for _, shards in saved:
        for shard, weight in shards:
            assert torch.equal(shard.of(tables[shard.table]), weight)
    return tables


@pytest.fixture(scope="module")
def row_wise_checkpoint(tmp_path_factory):
    """A row-wise DCP checkpoint written by 4 ranks at step 4 (after checking its resume) and its tables."""
    path = tmp_path_factory.mktemp("dcp_row_wise")
    return path, _resume_check(path, "row_wise", 4)


@pytest.mark.launches
def test_sharded_dcp_resume_is_bit_identical_row_wise_4_ranks(row_wise_checkpoint):
    path, tables = row_wise_checkpoint
    assert len(tables) == len(CARDS) and (path / ".metadata").exists()


@pytest.mark.launches
@pytest.mark.parametrize("kind", ["table_wise", "column_wise"])
def test_sharded_dcp_resume_is_bit_identical_2_ranks(tmp_path, kind):
    _resume_check(tmp_path, kind, 2)


@pytest.mark.launches
def test_dcp_loads_into_another_world_size_and_plan(row_wise_checkpoint):
    path, tables = row_wise_checkpoint

    def reload(kinds):
        out = []
        for kind in kinds:
            model = hybrid.HybridDLRM(DLRMConfig(tuple(CARDS)), kind)
            opt = make_optimizer(model, "adam", 1e-2)
            progress = checkpoint.load_sharded(model, opt, path)
            out.append(
                (
                    progress,
                    [
                        (s, w.detach().clone(), opt.state[w]["step"].item())
                        for s, w in zip(model.embeddings.shards, model.embeddings.weights, strict=False)
                    ],
                )
            )
        return out

    for per_kind in launch(reload, ["row_wise", "column_wise", "table_wise"], world_size=2, timeout=120):
        for progress, shards in per_kind:
            assert progress == {"step": 4}
            for shard, weight, adam_step in shards:
                assert torch.equal(weight, shard.of(tables[shard.table])) and adam_step == 4.0


@pytest.mark.launches
def test_hash_split_cannot_be_checkpointed_as_dtensor(tmp_path):
    def save():
        model = hybrid.HybridDLRM(DLRMConfig(tuple(CARDS)), "row_wise", split="hash")
        with pytest.raises(ValueError, match="DTensor cannot describe"):
            checkpoint.save_sharded(model, make_optimizer(model), tmp_path)
        return True

    assert launch(save, world_size=2, timeout=60) == [True, True]


def test_missing_checkpoint_is_none(tmp_path):
    assert checkpoint.load_on_every_rank(Path(tmp_path) / "nothing.pt") is None


def test_young_daly_interval_and_quiz_08_answer():
    from course_utils import quiz

    tau = checkpoint.young_daly_interval(60, 24 * 3600)
    assert abs(tau - 3220) < 1
    answer = {q.number: q.options[q.answer] for q in quiz.load(8).questions}[7]
    assert answer == f"About every {tau / 60:.0f} minutes"
    with pytest.raises(ValueError, match="must be positive"):
        checkpoint.young_daly_interval(0, 10)
