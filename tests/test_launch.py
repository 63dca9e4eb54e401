"""course_utils.launch: results, output, failures, hangs, interrupts, clean-up, start methods."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_utils.runtime import examples
from course_utils.runtime.launcher import LaunchError, LaunchTimeoutError, RankFailedError, launch

pytestmark = [pytest.mark.chapter(0), pytest.mark.launches]


def _record_pid(pid_dir):
    Path(pid_dir, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # a zombie still answers, so this also checks that we reaped
    except ProcessLookupError:
        return False
    return True


def _assert_all_gone(pid_dir, world_size):
    pids = [
        int(Path(pid_dir, f"{r}.pid").read_text())
        for r in range(world_size)
        if Path(pid_dir, f"{r}.pid").exists()
    ]
    assert pids, "the ranks never recorded their pids"
    assert [p for p in pids if _alive(p)] == []


# --- ranks' functions (defined here: fork runs them without importing) ----------


def rank_info(offset):
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return (
        dist.get_rank(),
        dist.get_world_size(),
        dist.get_backend(),
        torch.get_num_threads(),
        t.item() + offset,
    )


def print_late_from_rank0():
    if dist.get_rank() == 0:
        time.sleep(0.3)  # rank 0 prints last in time, yet must be shown first
    print(f"line from rank {dist.get_rank()}")
    print(f"second line from rank {dist.get_rank()}")


def raise_on_rank1(pid_dir):
    _record_pid(pid_dir)
    if dist.get_rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that never comes


def skip_collective_on_rank1(pid_dir):
    _record_pid(pid_dir)
    if dist.get_rank() != 1:
        dist.all_reduce(torch.ones(1))
    return dist.get_rank()


def exit_abruptly_on_rank1(pid_dir):
    _record_pid(pid_dir)
    if dist.get_rank() == 1:
        os._exit(3)
    time.sleep(30)


def sleep_long(pid_dir):
    _record_pid(pid_dir)
    time.sleep(60)


def own_process_group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    dist.barrier()  # leave only once every rank has joined (tests/test_group_teardown.py)
    dist.destroy_process_group()
    return rank, os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]


# --- success -------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_results_in_rank_order_with_group_ready(world_size):
    results = launch(rank_info, 10.0, world_size=world_size, timeout=60)
    expected_sum = sum(range(world_size)) + 10.0
    assert results == [(r, world_size, "gloo", 1, expected_sum) for r in range(world_size)]


def test_output_grouped_by_rank_in_rank_order_and_engine_quiet(capsys):
    launch(print_late_from_rank0, world_size=3, timeout=60)
    out, err = capsys.readouterr()
    assert out == "".join(
        f"[rank {r}] line from rank {r}\n[rank {r}] second line from rank {r}\n" for r in range(3)
    )
    assert err == ""  # the elastic agent's own logging stays quiet on success


def test_init_group_false_leaves_the_group_to_the_function():
    assert launch(own_process_group, world_size=2, init_group=False, timeout=60) == [
        (0, "2", "0"),
        (1, "2", "1"),
    ]


def test_twenty_launches_in_a_row_in_one_process():
    for i in range(20):
        assert launch(examples.sum_of_ranks, world_size=2, timeout=60, show_output=False) == [1.0, 1.0], i


# --- failures --------------------------------------------------------------------


def test_rank_that_raises_is_named_with_its_own_traceback(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch(raise_on_rank1, str(tmp_path), world_size=2, timeout=60)
    assert time.monotonic() - start < 15  # fails fast, not after the timeout
    err = info.value
    assert (err.rank, err.exc_type, err.message) == (1, "ValueError", "rank 1 fails on purpose")
    assert "in raise_on_rank1" in err.traceback and 'raise ValueError("rank 1 fails' in err.traceback
    assert "elastic" not in err.traceback and "run_rank" not in err.traceback
    assert str(err).startswith("rank 1 failed with ValueError: rank 1 fails on purpose")
    _assert_all_gone(tmp_path, 2)


def test_rank_that_hangs_times_out_naming_it(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch(skip_collective_on_rank1, str(tmp_path), world_size=3, timeout=3)
    took = time.monotonic() - start
    assert 3 <= took < 15, took
    assert info.value.unfinished == [0, 2]
    assert "rank(s) [0, 2] did not finish within 3 s (finished: [1])" in str(info.value)
    assert isinstance(info.value, TimeoutError)
    _assert_all_gone(tmp_path, 3)


def test_rank_that_dies_without_exception(tmp_path):
    with pytest.raises(RankFailedError) as info:
        launch(exit_abruptly_on_rank1, str(tmp_path), world_size=2, timeout=60)
    assert info.value.rank == 1 and "exited with code 3" in str(info.value)
    _assert_all_gone(tmp_path, 2)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals need the main thread"
)
def test_keyboard_interrupt_stops_every_rank_and_restores_handlers(tmp_path):
    handler_before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(sleep_long, str(tmp_path), world_size=2, timeout=60)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 15
    assert signal.getsignal(signal.SIGINT) is handler_before
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ
    _assert_all_gone(tmp_path, 2)


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="world_size must be a whole number >= 1"):
        launch(rank_info, 0.0, world_size=0)
    with pytest.raises(ValueError, match="needs CUDA GPUs|one GPU per rank"):
        launch(rank_info, 0.0, world_size=2, backend="nccl")
    with pytest.raises(ValueError, match="unknown backend 'ncl'"):
        launch(rank_info, 0.0, backend="ncl")
    with pytest.raises(ValueError, match="timeout must be positive"):
        launch(rank_info, 0.0, timeout=0)


# --- spawn -------------------------------------------------------------------


def test_spawn_runs_an_importable_function():
    assert launch(examples.hello, world_size=2, start_method="spawn", timeout=120, show_output=False) == [
        "rank 0 of 2 (gloo)",
        "rank 1 of 2 (gloo)",
    ]


def test_spawn_runs_a_function_defined_in_a_notebook(monkeypatch):
    notebook_main = types.ModuleType("__main__")  # like a kernel's __main__: no __file__
    monkeypatch.setitem(sys.modules, "__main__", notebook_main)
    offset = 100  # a global of the cell, sent with the function

    def cell_function(scale):
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return {"rank": dist.get_rank(), "sum": t * scale + offset}

    cell_function.__module__ = "__main__"
    results = launch(cell_function, 2.0, world_size=2, start_method="spawn", timeout=120, show_output=False)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(torch.equal(r["sum"], torch.tensor([102.0])) for r in results)


def test_spawn_names_what_cannot_be_sent():
    with pytest.raises(LaunchError, match="must pickle the function and its arguments.*lock"):
        launch(rank_info, threading.Lock(), world_size=2, start_method="spawn", timeout=60)


def test_a_cell_class_returned_by_the_ranks_comes_back_under_spawn_and_fork():
    """Spawned ranks rebuilt the cell's class from its value; the result must bring it back (by
    value: the rank's own ``__main__`` has no such name). Forked ranks send it by name, as before."""
    code = """
    import torch.distributed as dist
    from course_utils import launch

    class Point:                              # a class defined in a notebook cell
        def __init__(self, x):
            self.x = x

    def make_point(scale):                    # a cell function that returns one, and a lambda
        return Point(scale * (dist.get_rank() + 1)), lambda v: v * scale

    for method in ("fork", "spawn"):          # fork first, before spawn has pickled Point
        out = launch(make_point, 2.0, world_size=2, start_method=method, timeout=120, show_output=False)
        print(method, [p.x for p, _ in out], out[1][1](5.0), all(type(p) is Point for p, _ in out))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["fork [2.0, 4.0] 10.0 True", "spawn [2.0, 4.0] 10.0 True"]


def _moved_to_the_rank_gpu(tensor):
    return ("moved to the rank's GPU", tensor)


def test_a_tensor_not_on_the_cpu_reaches_spawned_ranks_as_a_cpu_copy(monkeypatch, meta_as_gpu):
    """A meta tensor stands in for a CUDA one, which torch alone would restore on this process's
    GPU in every rank. A gloo rank gets it on the CPU (its rank_device()); an NCCL rank hands it
    to ``to_rank_gpu`` (tests/gpu check that one), replaced here by a stand-in."""
    from course_utils.runtime.launcher import api

    copied = meta_as_gpu
    meta = torch.empty(2, 3, device="meta")
    args = (
        meta,
        {"again": meta, "param": torch.nn.Parameter(torch.empty(4, device="meta")), "cpu": torch.ones(1)},
    )
    fn, (t, more) = pickle.loads(api._spawn_payload(rank_info, args, "gloo"))
    assert fn is rank_info and sorted(copied) == [(2, 3), (4,)]  # one copy of a tensor met twice
    assert t is more["again"] and torch.equal(t, torch.zeros(2, 3))
    assert isinstance(more["param"], torch.nn.Parameter) and more["param"].requires_grad
    assert all(x.device.type == "cpu" for x in (t, more["param"], more["cpu"]))

    monkeypatch.setattr(api, "to_rank_gpu", _moved_to_the_rank_gpu)
    _, (t, more) = pickle.loads(api._spawn_payload(rank_info, args, "nccl"))
    assert t[0] == "moved to the rank's GPU" and t[1].device.type == "cpu" and more["again"] is t
    assert more["param"][0] == "moved to the rank's GPU" and isinstance(more["param"][1], torch.nn.Parameter)
    assert more["cpu"].device.type == "cpu"  # a CPU tensor stays on the CPU, as under fork


def killed_on_rank1(pid_dir):
    _record_pid(pid_dir)
    if dist.get_rank() == 1:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))  # ranks 0 and 2 lose their connection to rank 1 here


def test_a_killed_rank_is_blamed_not_the_peers_that_lost_it(tmp_path):
    for _ in range(3):  # which failure the engine notices first varies; the blame must not
        with pytest.raises(RankFailedError) as info:
            launch(killed_on_rank1, str(tmp_path), world_size=3, timeout=60)
        assert info.value.rank == 1, str(info.value)
        assert info.value.exc_type == "ProcessExit"
        _assert_all_gone(tmp_path, 3)


def aborted_on_rank1(pid_dir):
    _record_pid(pid_dir)
    if dist.get_rank() == 1:
        os.write(2, b"terminate called after throwing an instance of 'std::runtime_error'\n")
        os.abort()  # SIGABRT, as C++'s std::terminate ends a process
    dist.all_reduce(torch.ones(1))


def test_a_rank_that_dies_in_native_code_is_reported_with_its_last_stderr_lines(tmp_path):
    with pytest.raises(RankFailedError) as info:
        launch(aborted_on_rank1, str(tmp_path), world_size=2, timeout=60, show_output=False)
    assert info.value.rank == 1 and info.value.exc_type == "ProcessExit"
    assert "SIGABRT" in info.value.message, str(info.value)
    said = info.value.traceback
    assert "its stderr as it died:)\nterminate called after throwing" in said, said
    assert "Fatal Python error: Aborted" in said and "in aborted_on_rank1" in said, said
    _assert_all_gone(tmp_path, 2)


def unpicklable_result_on_rank1(pid_dir):
    _record_pid(pid_dir)
    return threading.Lock() if dist.get_rank() == 1 else dist.get_rank()


def test_a_result_that_cannot_be_sent_back_is_named(tmp_path):
    with pytest.raises(RankFailedError) as info:
        launch(unpicklable_result_on_rank1, str(tmp_path), world_size=2, timeout=60)
    assert info.value.rank == 1 and info.value.exc_type == "ResultNotSent"
    assert (
        "cannot be pickled" in info.value.message and "cannot pickle '_thread.lock'" in info.value.traceback
    )
    _assert_all_gone(tmp_path, 2)


def large_result():
    return torch.full((4 * 2**20,), float(dist.get_rank()))  # 16 MB: far more than a pipe holds


def test_a_large_result_comes_back_in_a_file_and_torchs_queue_carries_none(monkeypatch):
    """A rank stopped half way through putting a large result in the engine's return queue would
    leave the engine waiting forever for the rest: the queue must carry nothing of size."""
    from course_utils.runtime.launcher import api

    queued, engine = [], api.elastic_launch

    def recording(config, entrypoint):
        run = engine(config, entrypoint)
        return lambda *args: queued.append(run(*args)) or queued[-1]

    monkeypatch.setattr(api, "elastic_launch", recording)
    results = launch(large_result, world_size=2, timeout=60)
    assert queued == [{0: None, 1: None}]
    assert [r.shape[0] for r in results] == [4 * 2**20] * 2 and [r[-1].item() for r in results] == [0.0, 1.0]


def test_a_platform_without_posix_signals_is_refused_with_the_way_out(monkeypatch):
    """Native Windows has no SIGKILL, SIGHUP or SIGQUIT: a clear error, not an AttributeError."""
    monkeypatch.delattr(signal, "SIGHUP")
    monkeypatch.delattr(signal, "SIGQUIT")
    with pytest.raises(LaunchError, match=r"SIGHUP, SIGQUIT do not exist .* Linux or Windows through WSL"):
        launch(examples.hello, world_size=2)


def test_a_native_death_reported_after_its_peer_still_names_the_signal(tmp_path):
    """The engine stops at the first failure it polls. When that is rank 0's lost connection
    (exit code 1), rank 1's own exit code is not in its report: the signal is read from the
    faulthandler line rank 1 printed as it died (a race CI met once in ~30 runs)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from course_utils.runtime.launcher.errors import diagnose_failure

    (tmp_path / "rank0.error").write_text(
        "RuntimeError\n[pair.cc:553] Connection closed by peer [127.0.0.1]:23985\n\x00Traceback ..."
    )
    logs = tmp_path / "logs" / "run" / "attempt_0" / "1"
    logs.mkdir(parents=True)
    (logs / "stderr.log").write_text(
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "x.py", line 3 in aborted_on_rank1\n'
    )
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(tmp_path / "none.json"))
    error = diagnose_failure(ChildFailedError("run_rank", {0: failure}), tmp_path, 2, [])
    assert error.rank == 1 and error.exc_type == "ProcessExit", str(error)
    assert "killed by signal SIGABRT" in error.message and "rank(s) [0] then lost" in error.message, str(
        error
    )


def test_a_rank_that_returned_then_died_is_blamed_not_the_peer_stopped_after_it(tmp_path):
    """Rank 1 returned (its result and ``done`` marker written) and was then killed; rank 0, still
    writing its result, was stopped by the engine. A finished rank only waits for the others and
    leaves its group: nothing of a peer's killed it, so it is the one named."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from course_utils.runtime.launcher.errors import diagnose_failure

    (tmp_path / "rank1.done").write_text("")
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=-9, error_file=str(tmp_path / "none.json"))
    error = diagnose_failure(ChildFailedError("run_rank", {1: failure}), tmp_path, 2, [])
    assert error.rank == 1 and error.exc_type == "ProcessExit", str(error)
    assert "function returned, but its process then was killed by signal SIGKILL" in error.message


# --- start method and the plain torchrun script of chapter 00 ----------------


def test_auto_forks_on_linux_and_spawns_on_macos(monkeypatch):
    """On macOS Python itself spawns by default (fork is unsafe there): ``auto`` follows it."""
    from course_utils.runtime.launcher import api

    monkeypatch.setattr(sys, "platform", "linux")
    assert api._start_method("auto") == "fork"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert api._start_method("auto") == "spawn"
    assert api._start_method("fork") == "fork"  # asked for by name: as asked


def test_the_plain_torchrun_hello_world_sums_the_ranks():
    from course_utils.runtime import runner

    command = runner.LAUNCHERS["torchrun"] + ["--standalone", "--nproc-per-node", "3"]
    [(printed, _)], _ = runner.run_together(
        [command + ["-m", "course_utils.scripts.hello_world"]], timeout=120
    )
    hellos = sorted(line for line in printed.splitlines() if line.startswith("hello"))  # 2.9's gloo logs too
    assert hellos == [f"hello from rank {r} of 3: all_reduce gave 6" for r in range(3)], printed
