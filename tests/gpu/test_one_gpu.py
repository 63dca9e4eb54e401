"""One GPU: launching from a notebook that touched CUDA, fallbacks, timers, results on the CPU."""

import os

import pytest
import torch
from helpers.fresh_python import fresh_python

from course_utils import launch
from course_utils.runtime.timing import CudaSpan, Stopwatch

pytestmark = [pytest.mark.chapter(), pytest.mark.gpu(1)]


@pytest.mark.launches
def test_launch_after_is_available_forks_and_the_rank_gets_cuda_0():
    lines = fresh_python("""
    import torch, torch.distributed as dist
    import course_utils                       # the setup cell imports it first
    from course_utils import launch
    from course_utils.runtime.launcher import api as launcher
    from course_utils.runtime.hardware import rank_device
    assert torch.cuda.is_available()          # what every tutorial does first
    print(launcher._start_method("auto"))
    print(launch(lambda: (str(rank_device()), dist.get_backend()), world_size=1, show_output=False))
    """)
    assert lines == ["fork", "[('cuda:0', 'cpu:gloo,cuda:nccl')]"]


@pytest.mark.launches
def test_launch_after_cuda_init_spawns_a_cell_function_and_returns_cpu_tensors():
    lines = fresh_python("""
    import torch, torch.distributed as dist
    from course_utils import launch
    from course_utils.runtime.launcher import api as launcher
    x = torch.ones(3, device="cuda")          # CUDA is initialised in the "notebook"

    def cell_function(scale):
        t = torch.full((2,), float(dist.get_rank() + 1), device="cuda") * scale
        dist.all_reduce(t)
        return t

    out = launch(cell_function, 2.0, world_size=1, show_output=False)
    print(launcher._start_method("auto"), out[0].device, out[0].tolist())
    """)
    assert lines == ["spawn cpu [2.0, 2.0]"]


@pytest.mark.launches
def test_results_never_initialise_cuda_in_the_notebook():
    lines = fresh_python("""
    import torch
    from course_utils import launch
    from course_utils.runtime.hardware import rank_device
    out = launch(lambda: {"w": torch.randn(4, device=rank_device())}, world_size=1, show_output=False)
    print(out[0]["w"].device, torch.cuda.is_initialized())
    """)
    assert lines == ["cpu False"]


def _where():
    import torch.distributed as dist

    from course_utils.runtime.hardware import rank_device

    return dist.get_backend(), str(rank_device())


@pytest.mark.launches
def test_more_ranks_than_gpus_falls_back_to_gloo_on_the_cpu():
    from course_utils import gpu_count

    n = gpu_count() + 1
    assert launch(_where, world_size=n, show_output=False) == [("gloo", "cpu")] * n


def _sleep_cycles(seconds: float, device: torch.device) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``seconds``, timed with CUDA
    events (``torch.cuda.clock_rate`` would need nvidia-ml-py, and gives the current MHz)."""
    probe = 10_000_000
    with torch.cuda.device(device):
        torch.cuda._sleep(probe)  # warm up: the clock rises from idle
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
    return int(probe * seconds * 1e3 / start.elapsed_time(end))


def test_timers_charge_gpu_work_to_the_step_that_queued_it():
    device = torch.device("cuda", 0)
    cycles = _sleep_cycles(0.05, device)  # 50 ms of GPU work, queued in a few microseconds
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


@pytest.mark.launches
def test_two_stand_in_nodes_on_one_gpu_train_with_gloo():
    """Pinned to this machine's first visible GPU: two stand-in nodes cannot have one each, so
    both run gloo (never two NCCL ranks on one GPU). With two GPUs, test_two_gpus checks NCCL."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    lines = fresh_python(
        """
        from course_utils.runtime import runner
        run = runner.run_torchrun(module="course_utils.scripts.train_ddp", nproc_per_node=1, nnodes=2,
                                  rendezvous="c10d", timeout=300)
        same = run.reports[0]["fingerprint"] == run.reports[1]["fingerprint"]
        print([r["backend"] for r in run.reports], same)
        """,
        env={"CUDA_VISIBLE_DEVICES": first},
        timeout=400,
    )
    assert lines == ["['gloo', 'gloo'] True"]


@pytest.mark.launches
def test_a_cuda_tensor_sent_to_spawned_ranks_lands_on_each_rank_device():
    """An NCCL rank gets it on its GPU, a gloo rank on the CPU (never on the notebook's GPU)."""
    lines = fresh_python("""
    import torch
    from course_utils import gpu_count, launch
    from course_utils.runtime.hardware import rank_device
    x = torch.arange(3.0, device="cuda")      # CUDA is initialised in the "notebook": ranks spawn
    w = torch.nn.Parameter(torch.ones(2, device="cuda"))

    def where(t, p):
        return (str(t.device), str(rank_device()), t.tolist(), type(p).__name__, str(p.device),
                torch.cuda.is_initialized())

    print(launch(where, x, w, world_size=1, show_output=False))
    print(launch(where, x, w, world_size=gpu_count() + 1, show_output=False)[-1])  # gloo
    """)
    assert lines == [
        "[('cuda:0', 'cuda:0', [0.0, 1.0, 2.0], 'Parameter', 'cuda:0', True)]",
        "('cpu', 'cpu', [0.0, 1.0, 2.0], 'Parameter', 'cpu', False)",
    ]
