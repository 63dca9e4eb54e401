"""Appendices 04a and 04b on a GPU: float16 autocast with a GradScaler under DDP, torch's bf16 hook, pinned
batches copied without waiting. The CPU twins are in tests/test_ddp_practice.py."""

import pytest
import torch

from course_utils import launch
from course_utils.ddp import comm_hooks, input_pipeline, mixed_precision

pytestmark = [pytest.mark.chapter(), pytest.mark.gpu(1)]


@pytest.mark.launches
def test_float16_autocast_with_a_scaler_on_one_gpu_stays_near_float32():
    run = launch(mixed_precision.train_amp, world_size=1, timeout=120)[0]
    assert run["dtype"] == "float16"
    gap = (run["amp"]["weights"] - run["float32"]["weights"]).abs().max().item()
    assert gap < 5e-3
    assert run["scale"] > 0


def _torch_bf16_hook_on_nccl():
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    from torch.nn.parallel import DistributedDataParallel

    from course_utils.ddp.overlap import tower
    from course_utils.runtime.hardware import rank_device

    device = rank_device()
    results = []
    for hook in (bf16_compress_hook, comm_hooks.bf16_hook):
        model = DistributedDataParallel(tower(64, 4).to(device), device_ids=[device])
        model.register_comm_hook(None, hook)  # torch's: accepted on a CUDA build with NCCL
        for _ in range(2):
            model(torch.ones(8, 64, device=device)).sum().backward()
        results.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu())
    return dist.get_backend(), results


@pytest.mark.launches
def test_torchs_bf16_hook_registers_on_nccl_and_matches_the_course_twin():
    backend, (theirs, ours) = launch(_torch_bf16_hook_on_nccl, world_size=1, timeout=120)[0]
    assert "nccl" in backend
    assert torch.equal(theirs, ours)


def test_loader_pins_gpu_batches_and_copies_them_without_waiting():
    device = torch.device("cuda", 0)
    loader = input_pipeline.make_loader(input_pipeline.WhoMadeIt(64), 8, device, num_workers=2)
    rows = []
    for batch in loader:
        assert all(t.is_pinned() for t in batch)
        on_gpu = input_pipeline.to_device(batch, device)
        rows += on_gpu[0].cpu().tolist()
    torch.cuda.synchronize()
    assert sorted(rows) == list(range(64))  # one rank: every row, once
