"""The production job (course_utils.scripts.train_hybrid) under the real torchrun, on 2 and 4 CPU ranks:
a SIGTERM and a resize each end where the uninterrupted job ends (bit-identical where the layout is
kept, AUC within 0.005 across a resize); the exact distributed AUC; its parts.

A rank killed after step 20, and the SLURM template's three runs (a lost node, the time limit's
signal, the requeue), are cells of chapter 08 (section 5) and appendix 08c (section 2), which
assert that each ends on the uninterrupted run's parameters; nbval runs them on every supported
torch (CONTRIBUTING, "What CI runs"), so they are not run a fourth time here."""

import shutil

import numpy as np
import pytest

from course_utils import launch
from course_utils.checkpoint import latest_complete, random_state
from course_utils.runtime import elastic_run
from course_utils.workload import metrics
from course_utils.workload.global_auc import distributed_auc, gather_predictions

pytestmark = [pytest.mark.chapter(8), pytest.mark.launches]

JOB = dict(module="course_utils.scripts.train_hybrid", out_flag="--checkpoint-dir", timeout=240)


def finished(run) -> dict:
    """Rank 0's "finished" event of the run's last attempt: ``step``, ``auc``, ``sha256``."""
    events = run if isinstance(run, list) else run.events
    ends = [e for e in events if e["event"] == "finished" and e["rank"] == 0]
    stderr = "" if isinstance(run, list) else run.stderr[0][-2000:]
    assert ends, "\n".join(elastic_run.timeline(events)) + stderr
    return ends[-1]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """40 steps on 2 ranks, never interrupted."""
    return elastic_run.run_elastic(tmp_path_factory.mktemp("straight"), script_args=["--steps", 40], **JOB)


def test_sigterm_leaves_a_complete_checkpoint_that_resumes_to_the_same_parameters(straight, tmp_path):
    stopped = elastic_run.run_elastic(tmp_path, script_args=["--steps", 40], terminate_at_step=12, **JOB)
    assert stopped.terminated
    last = [e for e in stopped.events if e["event"] == "stopped"]
    assert {e["rank"] for e in last} == {0, 1} and len({e["step"] for e in last}) == 1  # one agreed step
    step = last[0]["step"]
    assert 12 <= step < 40 and latest_complete(tmp_path).name == f"step_{step:06d}"
    resumed = elastic_run.run_elastic(tmp_path, script_args=["--steps", 40], **JOB)
    assert f"attempt 1: ranks [0, 1] resumed from the checkpoint of step {step}" in elastic_run.timeline(
        resumed.events
    )
    assert finished(resumed)["sha256"] == finished(straight)["sha256"]


def test_the_hash_is_the_same_whatever_the_number_of_ranks_that_hold_the_state(straight, tmp_path):
    """The straight run's last checkpoint, loaded by 4 ranks and by 1, with no step left to train."""
    for world in (4, 1):
        folder = tmp_path / f"on{world}"
        shutil.copytree(straight.out / "data", folder / "data")
        shutil.copytree(latest_complete(straight.out), folder / "step_000040")
        again = elastic_run.run_elastic(folder, nproc_per_node=world, script_args=["--steps", 40], **JOB)
        assert finished(again)["sha256"] == finished(straight)["sha256"]
        assert finished(again)["auc"] == pytest.approx(finished(straight)["auc"], abs=1e-12)


def test_a_checkpoint_written_by_2_ranks_resumes_on_4_within_0_005_of_auc(tmp_path):
    uninterrupted = elastic_run.run_elastic(tmp_path / "straight", script_args=["--steps", 80], **JOB)
    elastic_run.run_elastic(tmp_path / "resized", script_args=["--steps", 40], **JOB)
    resized = elastic_run.run_elastic(
        tmp_path / "resized", nproc_per_node=4, script_args=["--steps", 80], **JOB
    )
    assert "resumed from the checkpoint of step 40" in elastic_run.timeline(resized.events)[-4]
    assert {e["world_size"] for e in resized.events if e["event"] == "resumed"} == {4}
    assert abs(finished(resized)["auc"] - finished(uninterrupted)["auc"]) < 0.005


def _global_auc(labels, scores):
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = slice(*[(0, 50), (50, 50), (50, 400)][rank])  # 50, none and 350 rows
    return distributed_auc(labels[mine], scores[mine]), gather_predictions(labels[mine], scores[mine])


def test_the_distributed_auc_is_the_auc_of_all_rows_not_the_mean_of_the_ranks():
    rng = np.random.default_rng(0)
    # rank 0's rows click more and score higher: informative across ranks, not within them
    labels = (rng.random(400) < np.where(np.arange(400) < 50, 0.8, 0.1)).astype(np.float32)
    scores = rng.random(400) + (np.arange(400) < 50)
    results = launch(_global_auc, labels, scores, world_size=3, timeout=60, show_output=False)
    exact = metrics.auc(labels, scores)
    for value, (all_labels, all_scores) in results:
        assert value == exact
        assert np.array_equal(all_labels, labels) and np.array_equal(all_scores, scores)
    per_rank_mean = np.mean([metrics.auc(labels[a:b], scores[a:b]) for a, b in [(0, 50), (50, 400)]])
    assert exact > 0.7 and abs(per_rank_mean - exact) > 0.15


def test_a_random_state_restored_draws_the_same_numbers():
    """Saved as tensors (torch, NumPy's and Python's generators, a Gaussian cached in each), restored."""
    import random

    import torch

    random_state.seed_all(3)
    np.random.standard_normal(), random.gauss(0, 1)  # each generator now caches a Gaussian
    saved = random_state.capture()
    assert all(isinstance(v, torch.Tensor) for v in saved.values())
    first = (torch.rand(3), np.random.standard_normal(3), random.gauss(0, 1))
    random_state.seed_all(99)
    random_state.restore(saved)
    again = (torch.rand(3), np.random.standard_normal(3), random.gauss(0, 1))
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]
