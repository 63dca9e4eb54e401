"""NCCL on two GPUs: what ``work.wait()`` orders, CUDA-event timing, uneven all-to-all, and NCCL's
flight recorder. Appendix 02a teaches these; the CPU twins are in tests/test_collectives.py.

Each test uses the course's functions unchanged; ``launch`` picks NCCL because every rank gets a
GPU. Nothing here depends on the machine's speed beyond a 0.2 s spin kernel on each GPU.
"""

import pytest
import torch
import torch.distributed as dist
from helpers.cpu_tests import run_cpu_tests

from course_utils import launch

pytestmark = pytest.mark.chapter()

RANKS = [pytest.param(n, marks=pytest.mark.gpu(n), id=f"{n}-ranks") for n in (1, 2)]


@pytest.mark.launches
@pytest.mark.parametrize("world_size", RANKS)
def test_wait_makes_the_stream_wait_not_the_host(world_size):
    from course_utils.collectives import streams

    busy = 0.2  # seconds of spin kernel queued on each GPU's current stream before the all-reduce
    for r in launch(streams.wait_semantics, busy, world_size=world_size, timeout=300):
        assert r["value"] == float(world_size)  # correct once the host has synchronised
        assert r["host_wait_s"] < busy / 2, r  # wait() returned while the GPU was still busy ...
        assert r["completed_at_wait"] is False, r  # ... so the all-reduce had not run yet
        assert r["device_s"] >= 0.8 * busy and r["host_value_s"] >= 0.8 * busy, r  # events saw it


@pytest.mark.gpu(1)
def test_time_on_device_with_cuda_events_counts_queued_work():
    from course_utils.collectives import streams
    from course_utils.runtime import compat

    device = torch.device("cuda", 0)
    with torch.cuda.device(device):
        rate = streams.gpu_cycles_per_second(device)
        seconds = streams.time_on_device(lambda: compat.gpu_sleep(int(0.1 * rate)), device)
    assert 0.05 < seconds < 0.5, seconds


@pytest.mark.launches
@pytest.mark.gpu(2)
def test_uneven_all_to_all_and_all_gather_on_nccl():
    run_cpu_tests("tests/test_collectives.py::test_all_to_all_uneven_and_all_gather_uneven[2]")


def _nccl_trace():
    from course_utils.collectives import flight_recorder
    from course_utils.runtime.hardware import rank_device

    t = torch.ones(4, device=rank_device())
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_reduce(torch.ones(8, device=rank_device()))
    torch.cuda.synchronize()
    return flight_recorder.recorded_collectives(nccl=True)


@pytest.mark.launches
@pytest.mark.parametrize("world_size", RANKS)
def test_nccl_flight_recorder_records_every_collective_in_order(monkeypatch, world_size):
    from course_utils.collectives import flight_recorder

    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "64")  # torch 2.9's default is 0 (off)
    traces = launch(_nccl_trace, world_size=world_size, timeout=300)
    names = [name for _, name, _ in traces[0]]
    assert names[-3:] == ["nccl:all_reduce", "nccl:broadcast", "nccl:all_reduce"], traces[0]
    assert flight_recorder.first_divergence(traces).startswith(f"all {world_size} ranks recorded the same")
