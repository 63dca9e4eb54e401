"""Checkpoints on a modeled cluster (course_utils.checkpoint.modeled_io): the real DCP saves run,
and their time is the modeled storage's: a blocking write, or a staging copy with the write in the
background, waited for by the next save."""

from functools import partial

import pytest
import torch

from course_utils import Cluster, launch
from course_utils.checkpoint import Checkpointer, latest_complete, modeled_io
from course_utils.checkpoint.background import slowest_rank_stalls, train_big_table

pytestmark = pytest.mark.chapter(8)

ROWS, DIM = 2_000, 64


def test_state_bytes_counts_every_tensor_once():
    state = {"model": {"w": torch.zeros(3, 4)}, "optimizer": [torch.zeros(5, dtype=torch.float64)], "step": 7}
    assert modeled_io.state_bytes(state) == 3 * 4 * 4 + 5 * 8


def test_outside_a_modeled_cluster_it_says_how_to_run(tmp_path):
    with pytest.raises(RuntimeError, match="launch"):
        modeled_io.ModeledCheckpointer(Checkpointer(tmp_path, "blocking"))


def _runs(folder, every, storage="parallel-fs"):
    node, out = Cluster("h100", "nvlink"), {}
    for mode in ("blocking", "async"):
        run = partial(
            train_big_table, folder / f"{mode}{every}", steps=4 * every, checkpoint_every=every, mode=mode,
            rows=ROWS, dim=DIM, storage=storage,
        )  # fmt: skip
        out[mode] = launch(run, world_size=2, cluster=node, timeout=120, show_output=False)
    return out


@pytest.mark.launches
def test_blocking_holds_the_write_async_the_staging_and_both_save_for_real(tmp_path):
    runs = _runs(tmp_path, every=8)
    storage = modeled_io.STORAGE["parallel-fs"]
    blocking, staged = slowest_rank_stalls(runs["blocking"]), slowest_rank_stalls(runs["async"])
    assert len(set(blocking)) == len(set(staged)) == 1 and len(blocking) == 4
    share = blocking[0] * storage.write_Bps  # bytes this rank wrote: half the table and its Adagrad sums
    assert ROWS * DIM * 4 <= share <= ROWS * DIM * 4 + 2**10
    assert abs(staged[0] * modeled_io.STAGING_BPS - share) <= 1e-9 * modeled_io.STAGING_BPS
    assert max(slowest_rank_stalls(runs["async"], "waited")) == 0  # 8 steps outlast one write
    for mode in runs:
        assert latest_complete(tmp_path / f"{mode}8").name == "step_000032"  # the real files


@pytest.mark.launches
def test_checkpoints_closer_than_one_write_wait_for_it(tmp_path):
    slow = modeled_io.Storage("a slow disk", 50e6, "a test's: one write outlasts a step")
    waited = slowest_rank_stalls(_runs(tmp_path, every=1, storage=slow)["async"], "waited")
    assert waited[0] == 0 and min(waited[1:]) > 0  # each later save waits for the write before it
