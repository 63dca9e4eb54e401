"""The launchers, for real: torchrun on one node and on two "nodes" on localhost, the deprecated
torch.distributed.launch, torch.multiprocessing.spawn, and the runner's failures and clean-up."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from course_utils.collectives import free_port
from course_utils.runtime import process_tree, runner, stderr_report
from course_utils.scripts import hello

pytestmark = [pytest.mark.chapter(2, 8), pytest.mark.launches]

EXPECTED_SUM = [sum(r + 1 for r in range(4)) * k for k in range(1, 9)]  # rank r holds (r+1)*[1..8]


@pytest.fixture(scope="module")
def one_node():
    return runner.run_torchrun(nproc_per_node=4, timeout=120)


def test_torchrun_one_node_sets_the_environment(one_node):
    assert one_node.commands == [
        "torchrun --nproc-per-node 4 --standalone -m course_utils.scripts.hello --out OUT"
    ]
    assert [r["rank"] for r in one_node.reports] == [0, 1, 2, 3]
    for rank, r in enumerate(one_node.reports):
        env = r["env"]
        assert (
            env["RANK"],
            env["LOCAL_RANK"],
            env["WORLD_SIZE"],
            env["LOCAL_WORLD_SIZE"],
            env["GROUP_RANK"],
        ) == (str(rank), str(rank), "4", "4", "0")
        assert env["MASTER_ADDR"] and env["MASTER_PORT"].isdigit()
        assert r["backend"] == "gloo" and r["world_size"] == 4
        assert r["all_reduce"] == EXPECTED_SUM and r["ring_all_reduce"] == EXPECTED_SUM
    assert {r["launcher_pid"] for r in one_node.reports} == set(one_node.launcher_pids)


def test_two_nodes_on_localhost_form_one_world_that_agrees_with_one_node(one_node):
    two = runner.run_torchrun(nproc_per_node=2, nnodes=2, rendezvous="static", timeout=120)
    assert len(two.commands) == 2 and "--node-rank 1" in two.commands[1] and "PORT" in two.commands[0]
    assert [r["rank"] for r in two.reports] == [0, 1, 2, 3]
    for r in two.reports:
        assert r["world_size"] == 4 and r["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert r["env"]["LOCAL_RANK"] == str(r["rank"] % 2)
        assert r["env"]["GROUP_RANK"] == str(r["rank"] // 2)  # the node's number
    # static rendezvous: --node-rank decides the node number; node 1's launcher ran ranks 2 and 3
    assert [r["launcher_pid"] for r in two.reports] == [two.launcher_pids[0]] * 2 + [two.launcher_pids[1]] * 2
    # same world, same numbers: the results agree with the single-node run
    assert [r["all_reduce"] for r in two.reports] == [r["all_reduce"] for r in one_node.reports]
    assert [r["ring_all_reduce"] for r in two.reports] == [r["ring_all_reduce"] for r in one_node.reports]


def test_two_nodes_with_the_elastic_c10d_rendezvous():
    two = runner.run_torchrun(nproc_per_node=1, nnodes=2, rendezvous="c10d", timeout=120)
    assert "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT" in two.commands[0]
    assert [r["rank"] for r in two.reports] == [0, 1]
    # the rendezvous numbers the nodes (whichever launcher it chose first): one rank each
    assert sorted(r["launcher_pid"] for r in two.reports) == sorted(two.launcher_pids)
    assert sorted(r["env"]["GROUP_RANK"] for r in two.reports) == ["0", "1"]
    expected = [3.0 * k for k in range(1, 9)]  # (1 + 2) * [1..8]
    assert all(r["all_reduce"] == expected == r["ring_all_reduce"] for r in two.reports)


def test_deprecated_launch_passes_local_rank_as_an_argument():
    run = runner.run_torchrun(
        "course_utils.scripts.legacy_launch",
        nproc_per_node=2,
        launcher="torch.distributed.launch",
        timeout=120,
    )
    assert run.commands[0].startswith("python -m torch.distributed.launch --nproc-per-node 2")
    assert [(r["argument"], r["LOCAL_RANK"], r["extra arguments"]) for r in run.reports] == [
        (0, "0", ["--local-rank=0"]),
        (1, "1", ["--local-rank=1"]),
    ]
    assert "torch.distributed.launch is deprecated" in run.stderr[0]


def test_a_script_with_only_the_old_local_rank_spelling_fails_under_the_old_launcher():
    with pytest.raises(runner.LauncherError) as failure:
        runner.run_torchrun(
            "course_utils.scripts.legacy_launch",
            nproc_per_node=1,
            launcher="torch.distributed.launch",
            args=["--old-spelling"],
            timeout=120,
        )
    assert "error: unrecognized arguments: --local-rank=0" in failure.value.stderr


def test_the_training_skeleton_equals_one_process_on_the_combined_batches():
    """Two DDP ranks on their sampler shares end where one process ends that takes, at each step,
    the mean loss over both ranks' batches (equal sizes: the average of their gradients)."""
    import torch
    from torch.utils.data import DistributedSampler

    from course_utils.scripts import train_skeleton as ts

    run = runner.run_torchrun("course_utils.scripts.train_skeleton", nproc_per_node=2, timeout=180)
    reports = run.reports
    assert [r["rank"] for r in reports] == [0, 1] and all(r["backend"] == "gloo" for r in reports)
    shares = [set(r["indices"]) for r in reports]
    assert not shares[0] & shares[1] and shares[0] | shares[1] == set(range(ts.SAMPLES))
    assert reports[0]["weights"] == reports[1]["weights"]
    saved = torch.cat([torch.tensor(v).view(-1) for v in reports[0]["saved"].values()])
    assert list(reports[0]["saved"]) == ["weight", "bias"]
    assert torch.equal(saved, torch.tensor(reports[0]["weights"]))

    g = torch.Generator().manual_seed(0)
    features = torch.randn(ts.SAMPLES, ts.FEATURES, generator=g)
    targets = features @ torch.arange(1.0, ts.FEATURES + 1).unsqueeze(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(ts.FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    samplers = [DistributedSampler(range(ts.SAMPLES), num_replicas=2, rank=r, seed=0) for r in (0, 1)]
    for epoch in range(ts.EPOCHS):
        orders = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        if epoch == 0:
            assert orders == [r["indices"] for r in reports]
        for start in range(0, len(orders[0]), ts.BATCH):
            losses = [
                torch.nn.functional.mse_loss(model(features[idx]), targets[idx])
                for idx in (order[start : start + ts.BATCH] for order in orders)
            ]
            optimizer.zero_grad()
            (sum(losses) / 2).backward()
            optimizer.step()
    single = torch.cat([p.detach().view(-1) for p in model.parameters()])
    torch.testing.assert_close(torch.tensor(reports[0]["weights"]), single, rtol=1e-5, atol=1e-5)
    assert reports[0]["last_loss"] < reports[0]["first_loss"] / 2


def test_mp_spawn_sets_no_environment_and_needs_explicit_ranks():
    with tempfile.TemporaryDirectory() as out:
        runner.spawn_and_wait(
            hello.spawned, (2, f"tcp://127.0.0.1:{free_port()}", out), nprocs=2, timeout=120
        )
        reports = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(v is None for r in reports for v in r["env"].values())
    assert reports[0]["all_reduce"] == [3.0 * k for k in range(1, 9)] == reports[1]["ring_all_reduce"]


def test_port_in_use_names_the_problem():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(runner.LauncherError) as info:
            runner.run_torchrun(
                nproc_per_node=1, nnodes=2, rendezvous="static", port=taken.getsockname()[1], timeout=120
            )
    first = str(info.value).splitlines()[0]
    assert first.startswith(
        "launcher 0 of 2 exited with code 1 because its rendezvous port is already in use"
    )


@pytest.fixture
def stopped(monkeypatch):
    """The launchers run_together starts, as it hands them to ``stop_tree`` (all of them, at the end)."""
    seen = []
    stop_tree = process_tree.stop_tree

    def recording(procs, *args, **kwargs):
        seen.extend(procs)
        return stop_tree(procs, *args, **kwargs)

    monkeypatch.setattr(process_tree, "stop_tree", recording)
    return seen


def test_runner_stops_what_outlives_its_timeout(stopped):
    # The timeout is far longer than "pass" can take on a busy machine and far shorter than the
    # sleeper's sleep, so it separates them whatever the load; what ended how is read from the
    # exit codes, not from the clock.
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    quick = [sys.executable, "-c", "pass"]
    with pytest.raises(runner.LauncherError, match=r"launcher\(s\) \[0\] of 2 were still running after 10 s"):
        runner.run_together([sleeper, quick], timeout=10)
    assert [p.returncode for p in stopped] == [-signal.SIGTERM, 0]  # the sleeper asked to stop, quick done


def test_runner_stops_the_partners_of_a_failed_launcher(stopped):
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    fails = [sys.executable, "-c", "import sys; sys.exit('boom')"]
    with pytest.raises(
        runner.LauncherError, match=r"launcher 1 of 2 exited with code 1; the end of its stderr:\nboom"
    ):
        runner.run_together([sleeper, fails], timeout=120)
    assert [p.returncode for p in stopped] == [-signal.SIGTERM, 1]  # its partner stopped, not waited for


def test_a_launcher_that_ignores_sigterm_is_killed_after_the_grace_period(stopped):
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)",
    ]
    start = time.monotonic()
    with pytest.raises(runner.LauncherError, match="still running after 3 s"):
        runner.run_together([stubborn], timeout=3, grace=1)
    assert stopped[0].returncode == -signal.SIGKILL and time.monotonic() - start < 30


def test_bad_runner_arguments():
    with pytest.raises(ValueError, match="launcher must be one of torchrun, torch.distributed.launch"):
        runner.run_torchrun(launcher="mpirun")
    with pytest.raises(ValueError, match="--standalone is for one node"):
        runner.run_torchrun(nnodes=2)
    with pytest.raises(ValueError, match="rendezvous must be 'standalone', 'static' or 'c10d'"):
        runner.run_torchrun(rendezvous="etcd")


# --- stand-in nodes on one machine never share a GPU ----------------------------------------


@pytest.mark.parametrize(
    "gpus, nnodes, per_node, expected",
    [
        (0, 2, 1, [{}, {}]),  # CPU: gloo anyway
        (1, 2, 1, [{"COURSE_BACKEND": "gloo"}] * 2),  # one GPU for two nodes
        (2, 2, 1, [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]),
        (2, 2, 2, [{"COURSE_BACKEND": "gloo"}] * 2),  # 4 ranks, 2 GPUs
        (4, 2, 1, [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]),
        (4, 2, 2, [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]),
        (4, 1, 4, [{}]),  # one node: torchrun's own choice
    ],
)
def test_each_stand_in_node_gets_its_own_gpus_or_gloo(monkeypatch, gpus, nnodes, per_node, expected):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(runner.hardware, "gpu_count", lambda: gpus)
    assert runner.node_environments(nnodes, per_node) == expected


def test_node_gpus_are_slices_of_the_visible_ones(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3,GPU-5f1c")
    monkeypatch.setattr(runner.hardware, "gpu_count", lambda: 3)
    assert runner.node_environments(3, 1) == [{"CUDA_VISIBLE_DEVICES": d} for d in ("2", "3", "GPU-5f1c")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    monkeypatch.setattr(runner.hardware, "gpu_count", lambda: 2)
    assert runner.node_environments(2, 1) == [{"CUDA_VISIBLE_DEVICES": "6"}, {"CUDA_VISIBLE_DEVICES": "7"}]


def test_run_torchrun_gives_each_node_its_environment_and_shows_it(monkeypatch):
    started = []

    def fake_run_together(commands, timeout, extra_env=None):
        started.append((commands, extra_env))
        return [("", "")] * len(commands), [0] * len(commands)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(runner, "run_together", fake_run_together)
    monkeypatch.setattr(runner.hardware, "gpu_count", lambda: 2)
    run = runner.run_torchrun("course_utils.scripts.train_ddp", nproc_per_node=1, nnodes=2, rendezvous="c10d")
    assert started[0][1] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert [c.split(" torchrun")[0] for c in run.commands] == [
        "CUDA_VISIBLE_DEVICES=0",
        "CUDA_VISIBLE_DEVICES=1",
    ]
    monkeypatch.setattr(runner.hardware, "gpu_count", lambda: 0)
    run = runner.run_torchrun(nproc_per_node=2)
    assert started[1][1] == [{}] and run.commands[0].startswith("torchrun --nproc-per-node 2")


def test_run_together_adds_each_command_its_own_variables():
    show = [
        sys.executable,
        "-c",
        "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['OMP_NUM_THREADS'])",
    ]
    outputs, _ = runner.run_together(
        [show, show], timeout=60, extra_env=[{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    )
    assert [out.strip() for out, _ in outputs] == ["0 1", "1 1"]


def test_a_launcher_error_keeps_the_ranks_exception_that_torchrun_pushed_out_of_the_tail():
    stderr = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "ValueError: --batch-size must be a multiple of the world size, got 100 for 3 ranks",
            *[f"torchrun summary line {i}" for i in range(30)],
        ]
    )
    tail = stderr_report.stderr_tail(stderr).splitlines()
    assert tail[0] == (
        "(first error) ValueError: --batch-size must be a multiple of the world size, got 100 for 3 ranks"
    )
    assert tail[-1] == "torchrun summary line 29" and len(tail) == 17
    aborted = "terminate called without an active exception\n" + "\n".join(f"summary {i}" for i in range(30))
    first_line = stderr_report.stderr_tail(aborted).splitlines()[0]
    assert first_line == "(first error) terminate called without an active exception"
    short = "torch.distributed.DistStoreError: Timed out\nlast line"
    assert stderr_report.stderr_tail(short) == short  # already in the tail: nothing added


def test_a_rank_ends_without_the_interpreters_shutdown_only_when_main_returns(tmp_path):
    """rank_exit: output flushed, exit code 0, and no shutdown (an atexit handler never runs);
    an exception still exits through Python (traceback, code 1)."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import atexit, sys\n"
        "from course_utils.scripts.rank_exit import run_without_interpreter_shutdown\n"
        "atexit.register(lambda: print('interpreter shutdown ran'))\n"
        "def main():\n"
        "    print('results written', end='')\n"
        "    if sys.argv[1] == 'fail':\n"
        "        raise ValueError('bad rank')\n"
        "run_without_interpreter_shutdown(main)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(runner.__file__).parents[2])}
    ok = subprocess.run([sys.executable, str(script), "ok"], capture_output=True, text=True, env=env)
    assert (ok.returncode, ok.stdout) == (0, "results written")
    failed = subprocess.run([sys.executable, str(script), "fail"], capture_output=True, text=True, env=env)
    assert failed.returncode == 1 and "ValueError: bad rank" in failed.stderr
    assert failed.stdout == "results writteninterpreter shutdown ran\n"
