"""Fault tolerance with the real torchrun: a rank killed with SIGKILL mid-training, a restart from
the last checkpoint, and the same final weights as an uninterrupted run; the SLURM template run
on two "nodes" of this machine."""

from pathlib import Path

import pytest
import torch

from course_utils import launch
from course_utils.runtime import elastic_run, slurm_local
from course_utils.scripts import elastic_train, job_events

pytestmark = [pytest.mark.chapter(8), pytest.mark.launches]

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "slurm_torchrun.sbatch"
KILL = ["--kill-rank", "1", "--kill-at-step", "14"]  # 16 steps, checkpoints every 5


def _uninterrupted(tmp_path, *args):
    """The same training under course_utils.launch, never interrupted: the final weights."""
    out = tmp_path / "uninterrupted"
    out.mkdir()
    return launch(
        elastic_train.train, elastic_train.parse(["--out", str(out), *args]), world_size=2, timeout=120
    )[0]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_killed_rank_restarts_from_checkpoint_and_ends_like_an_uninterrupted_run(tmp_path):
    run = elastic_run.run_elastic(tmp_path / "job", max_restarts=1, timeout=240, script_args=KILL)
    assert run.commands == [
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 2 "
        "--max-restarts 1 -m course_utils.scripts.elastic_train --out OUT " + " ".join(KILL)
    ]
    assert elastic_run.timeline(run.events) == [
        "attempt 0: ranks [0, 1] started from scratch",
        "  steps 1..13 done",
        "  rank 0 saved checkpoints at steps [5, 10]",
        "  rank 1 killed itself with SIGKILL before step 14; "
        "torchrun stopped the other ranks and restarted all of them",
        "attempt 1: ranks [0, 1] resumed from the checkpoint of step 10",
        "  steps 11..16 done",
        "  rank 0 saved checkpoints at steps [15]",
        "  finished at step 16 on ranks [0, 1]",
    ]
    # steps 11-13 ran twice; the second time saw the same batches and computed the same losses
    assert [e["restart_count"] for e in run.events if e["event"] == "resumed"] == [1, 1]  # one node: both 1
    loss = {(e["attempt"], e["rank"], e["step"]): e["loss"] for e in run.events if e["event"] == "step"}
    assert all(loss[0, r, s] == loss[1, r, s] for r in (0, 1) for s in (11, 12, 13))
    final = torch.load(run.out / "final.pt", weights_only=True)
    assert _same(final, _uninterrupted(tmp_path))


def test_slurm_template_launches_the_production_job_and_requeues_on_its_warning_signal():
    """The runs are appendix 08c's (section 2's cells compare them with the uninterrupted job)."""
    text = TEMPLATE.read_text()
    assert "scontrol show hostnames" in text and "srun --kill-on-bad-exit=1" in text
    assert "--rdzv-backend c10d" in text and "#SBATCH --requeue" in text
    assert "--node-rank" not in text.split("srun --kill-on-bad-exit=1")[1]  # c10d numbers the nodes
    assert "\nexport TORCH_NCCL_ASYNC_ERROR_HANDLING" not in text  # torchrun sets 1 by itself
    assert "-m course_utils.scripts.train_hybrid --checkpoint-dir" in text
    assert "#SBATCH --signal=B:USR1@" in text and "trap stop_and_requeue USR1 TERM" in text
    trap = text.split("stop_and_requeue() {")[1].split("}")[0]
    # SIGTERM to srun first, wait for the ranks' final checkpoint, then requeue (which ends a running job)
    assert trap.index("kill -TERM") < trap.index("wait") < trap.index("scontrol requeue")


def test_the_srun_stand_in_kills_the_other_tasks_on_a_bad_exit(tmp_path):
    """Node 1 fails at once, node 0 would run for a minute: with --kill-on-bad-exit=1 the job
    ends within seconds with node 1's status; without it, the stand-in waits for node 0."""
    import time

    import pytest

    from course_utils.runtime import runner

    script = tmp_path / "job.sbatch"
    body = "srun {flag} bash -c 'if [ $SLURM_NODEID = 1 ]; then exit 3; fi; sleep 60'\n"
    script.write_text(body.format(flag="--kill-on-bad-exit=1"))
    start = time.monotonic()
    with pytest.raises(runner.LauncherError, match="exited with code 3"):
        slurm_local.run_sbatch_locally(script, nodes=2, timeout=50)
    assert time.monotonic() - start < 20
    script.write_text(body.format(flag=""))
    with pytest.raises(runner.LauncherError, match="still running after 3 s"):
        slurm_local.run_sbatch_locally(script, nodes=2, timeout=3)


def test_killing_a_node_needs_torchrun_as_the_parent():
    import pytest

    with pytest.raises(RuntimeError, match="is not torchrun"):
        job_events.torchrun_agent()


def test_two_local_elastic_nodes_get_their_own_gpus_or_gloo(monkeypatch, tmp_path):
    from course_utils.runtime import runner

    started = []

    def fake_run_together(commands, timeout, watch=None, stop_partners=True):
        started.append(commands)
        return [("", "")] * len(commands), [0] * len(commands)

    monkeypatch.setattr(runner, "run_together", fake_run_together)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for gpus, own in (
        (0, ["", ""]),
        (1, ["COURSE_BACKEND=gloo"] * 2),
        (2, ["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"]),
    ):
        monkeypatch.setattr(runner.hardware, "gpu_count", lambda gpus=gpus: gpus)
        run = elastic_run.run_elastic(tmp_path / str(gpus), nnodes=2, nproc_per_node=1)
        prefixes = [
            c.split(" torchrun")[0].removeprefix("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1").strip()
            for c in run.commands
        ]
        assert prefixes == own, gpus
        assert all(c[0] == "env" for c in started[-1])


def test_the_srun_stand_in_gives_each_node_its_own_gpus_or_gloo(monkeypatch, tmp_path):
    from course_utils.runtime import runner

    script = tmp_path / "job.sbatch"
    script.write_text(
        "srun bash -c 'echo \"node $SLURM_NODEID: [$CUDA_VISIBLE_DEVICES] [$COURSE_BACKEND]\"'\n"
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("COURSE_BACKEND", raising=False)
    for gpus, per_node, expected in (
        (0, "1", ["node 0: [] []", "node 1: [] []"]),
        (1, "1", ["node 0: [] [gloo]", "node 1: [] [gloo]"]),
        (2, "1", ["node 0: [0] []", "node 1: [1] []"]),
        (4, "2", ["node 0: [0,1] []", "node 1: [2,3] []"]),
    ):
        monkeypatch.setattr(runner.hardware, "gpu_count", lambda gpus=gpus: gpus)
        out, _ = slurm_local.run_sbatch_locally(script, nodes=2, timeout=60, env={"GPUS_PER_NODE": per_node})
        assert sorted(out.splitlines()) == expected, gpus


def test_the_scripts_take_their_backend_from_course_backend(monkeypatch, tmp_path):
    """COURSE_BACKEND is what runner.node_environments sets; the scripts pass it to pick_backend."""
    import pytest

    from course_utils.scripts import train_ddp

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("COURSE_BACKEND", "nccl")  # refused on this GPU-less machine, before any group
    monkeypatch.setattr("course_utils.runtime.hardware.gpu_count", lambda: 0)
    threads = torch.get_num_threads()  # elastic_train.main sets 1 for its rank
    try:
        for main in (elastic_train.main, train_ddp.main):
            with pytest.raises(ValueError, match="backend='nccl' needs CUDA GPUs"):
                main(["--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)


def test_a_demonstration_kill_waits_for_the_last_checkpoint_its_attempt_started(tmp_path):
    """``train_hybrid``'s fault injector: the checkpoint it waits for before the kill, and the steps,
    attempts and ranks for which it returns (the kill itself: chapter 08's killed rank in section 5,
    and the lost node of appendix 08c's SLURM runs in section 2)."""
    from types import SimpleNamespace

    from course_utils.scripts.faults import FaultInjector

    def injector(kill_at_step, first_step=0, rank=1, attempt=0):
        args = SimpleNamespace(kill_at_step=kill_at_step, checkpoint_every=10, kill_rank=1, kill_what="rank")
        return FaultInjector(args, tmp_path, rank, attempt, first_step)

    assert injector(21).last_save == 20 and injector(20).last_save == 10 and injector(30).last_save == 20
    assert injector(21, first_step=20).last_save is None  # resumed at 20: nothing saved yet
    assert injector(5).last_save is None and injector(-1).last_save is None
    # each returns (a kill would take this process down with it)
    for step in (1, 20, 22):
        injector(21).before_step(step)  # not the kill's step
    injector(21, rank=0).before_step(21)  # not the rank --kill-rank names
    injector(21, attempt=1).before_step(21)  # a later attempt
