"""One GPU: launching from a notebook that touched CUDA, fallbacks, timers, results on the CPU."""

import subprocess
import sys
import textwrap

import pytest
import torch

from course_utils import launch
from course_utils.timing import CudaSpan, Stopwatch

pytestmark = pytest.mark.gpu(1)


def _fresh(code: str) -> list[str]:
    """Run ``code`` with ``-c`` (``__main__`` without a file, as in a notebook); its printed lines."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_launch_after_is_available_forks_and_the_rank_gets_cuda_0():
    lines = _fresh("""
    import torch, torch.distributed as dist
    import course_utils                       # the setup cell imports it first
    from course_utils import launch
    from course_utils.launcher import api as launcher
    from course_utils.hardware import rank_device
    assert torch.cuda.is_available()          # what every tutorial does first
    print(launcher._start_method("auto"))
    print(launch(lambda: (str(rank_device()), dist.get_backend()), world_size=1, show_output=False))
    """)
    assert lines == ["fork", "[('cuda:0', 'cpu:gloo,cuda:nccl')]"]


def test_launch_after_cuda_init_spawns_a_cell_function_and_returns_cpu_tensors():
    lines = _fresh("""
    import torch, torch.distributed as dist
    from course_utils import launch
    from course_utils.launcher import api as launcher
    x = torch.ones(3, device="cuda")          # CUDA is initialised in the "notebook"

    def cell_function(scale):
        t = torch.full((2,), float(dist.get_rank() + 1), device="cuda") * scale
        dist.all_reduce(t)
        return t

    out = launch(cell_function, 2.0, world_size=1, show_output=False)
    print(launcher._start_method("auto"), out[0].device, out[0].tolist())
    """)
    assert lines == ["spawn cpu [2.0, 2.0]"]


def test_results_never_initialise_cuda_in_the_notebook():
    lines = _fresh("""
    import torch
    from course_utils import launch
    from course_utils.hardware import rank_device
    out = launch(lambda: {"w": torch.randn(4, device=rank_device())}, world_size=1, show_output=False)
    print(out[0]["w"].device, torch.cuda.is_initialized())
    """)
    assert lines == ["cpu False"]


def _where():
    import torch.distributed as dist

    from course_utils.hardware import rank_device

    return dist.get_backend(), str(rank_device())


def test_more_ranks_than_gpus_falls_back_to_gloo_on_the_cpu():
    from course_utils import gpu_count

    n = gpu_count() + 1
    assert launch(_where, world_size=n, show_output=False) == [("gloo", "cpu")] * n


def test_timers_charge_gpu_work_to_the_step_that_queued_it():
    device = torch.device("cuda", 0)
    torch.cuda._sleep(1000)  # warm up
    torch.cuda.synchronize(device)
    cycles = int(torch.cuda.clock_rate() * 1e3 * 0.05) if hasattr(torch.cuda, "clock_rate") else 50_000_000
    with Stopwatch(device) as synced:
        torch.cuda._sleep(cycles)
    span = CudaSpan(device).start()
    torch.cuda._sleep(cycles)
    start_ms, end_ms = span.end().interval()
    with Stopwatch() as unsynced:  # no device: reads the clock while the GPU still works
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize(device)
    assert synced.seconds > 10 * unsynced.seconds
    assert end_ms - start_ms == pytest.approx(synced.seconds * 1e3, rel=0.5)


def test_two_stand_in_nodes_on_one_gpu_train_with_gloo():
    from course_utils.scripts import runner

    run = runner.run_torchrun(
        module="course_utils.scripts.train_ddp", nproc_per_node=1, nnodes=2, rendezvous="c10d", timeout=300
    )
    assert [r["backend"] for r in run.reports] == ["gloo", "gloo"]  # never two ranks on cuda:0
    assert run.reports[0]["fingerprint"] == run.reports[1]["fingerprint"]
