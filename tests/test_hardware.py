"""GPU discovery that keeps the process fork-safe, the NCCL group's CPU side, results on the CPU.

This machine has no GPU, so each test builds the situation of a GPU machine in
a fresh interpreter: CUDA's own entry points patched to raise (any call to them
would initialise CUDA and poison fork), NVML's answers patched in.
"""

import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime import hardware, nvml
from course_utils.runtime.launcher.rank_entry import ResultNotSent, result_bytes

pytestmark = pytest.mark.chapter(0)


def _run_fresh(code: str, timeout: float = 240) -> str:
    """Run ``code`` in a fresh interpreter with ``-c`` (so ``__main__`` has no file, as in a notebook)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# Patches that make this CPU build look like a 2-GPU machine whose CUDA must not be touched.
_GPU_MACHINE = """
    import torch
    def forbidden(*args, **kwargs):
        raise AssertionError("CUDA was initialised: fork is poisoned")
    torch._C._cuda_getDeviceCount = forbidden
    torch.cuda._lazy_init = forbidden
    torch.cuda._is_compiled = lambda: True
    torch.cuda._device_count_nvml = lambda: 2
    torch.distributed.is_nccl_available = lambda: True
    from course_utils.runtime import nvml
    from course_utils.runtime.nvml import GPUInfo
    T4 = 15 << 30
    nvml.visible_gpus = lambda: [GPUInfo("Tesla T4", "GPU-aa", T4), GPUInfo("Tesla T4", "GPU-bb", T4)]
"""


@pytest.mark.launches
def test_gpu_discovery_never_initialises_cuda():
    out = _run_fresh(
        _GPU_MACHINE
        + """
    from course_utils.runtime import hardware
    from course_utils.runtime.launcher import api as launcher
    print(hardware.gpu_count(), hardware.gpu_names())
    print(hardware.devices(2, quiet=True), hardware.pick_backend(2), hardware.pick_backend(3))
    print(launcher._start_method("auto"), torch.cuda.is_initialized())
    print(torch.cuda.is_available())  # after importing course_utils, a learner's usual first call is safe
    """
    )
    assert out.splitlines() == [
        "2 ['Tesla T4', 'Tesla T4']",
        "[device(type='cuda', index=0), device(type='cuda', index=1)] nccl gloo",
        "fork False",
        "True",
    ]


@pytest.mark.launches
def test_after_cuda_is_initialised_launch_spawns_and_runs_a_cell_function():
    out = _run_fresh("""
    import torch
    import torch.distributed as dist
    torch.cuda.is_initialized = lambda: True      # as after any CUDA work in the notebook
    from course_utils import launch
    from course_utils.runtime.launcher import api as launcher
    print(launcher._start_method("auto"))

    factor = 3                                    # a global of the "cell", sent by value

    def cell_function():
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        return t.item() * factor

    print(launch(cell_function, world_size=2, timeout=180, show_output=False))
    """)
    assert out.splitlines() == ["spawn", "[9.0, 9.0]"]


def test_nccl_groups_also_serve_cpu_tensors():
    assert hardware.group_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert hardware.group_backend("gloo") == "gloo"


def record_init_backend():
    return dist.get_backend(), torch.get_num_threads(), _SEEN


_SEEN = []


@pytest.mark.launches
def test_launch_starts_the_mixed_group_when_nccl_is_chosen(monkeypatch):
    """Forked ranks inherit these patches: a "2-GPU" machine whose NCCL group is started as gloo."""
    real_init = dist.init_process_group

    def init(backend, **kwargs):
        _SEEN.append(backend)  # what launch asked for, recorded in the rank
        real_init("gloo", **kwargs)  # this CPU build has no NCCL

    monkeypatch.setattr(hardware, "gpu_count", lambda: 2)
    monkeypatch.setattr(hardware.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    results = launch(record_init_backend, world_size=2, timeout=60, show_output=False)
    assert [r[2] for r in results] == [["cpu:gloo,cuda:nccl"]] * 2
    assert [r[1] for r in results] == [1, 1]  # NCCL ranks get one CPU thread too


@dataclass
class _Holder:
    weights: object
    step: int


def test_results_come_back_with_every_tensor_on_the_cpu(meta_as_gpu):
    """A meta tensor stands in for a CUDA tensor: any non-CPU tensor, however nested, is copied."""
    copied = meta_as_gpu
    meta = torch.empty(2, 3, device="meta")
    result = {
        "list": [meta, (1, meta)],
        "param": torch.nn.Parameter(torch.empty(4, device="meta")),
        "holder": _Holder(torch.empty(5, device="meta"), 7),
        "cpu": torch.ones(1),
    }
    back = pickle.loads(result_bytes(result))
    assert sorted(copied) == [(2, 3), (4,), (5,)]  # one copy of a tensor met twice
    assert back["list"][0] is back["list"][1][1]
    tensors = [back["list"][0], back["list"][1][1], back["param"], back["holder"].weights, back["cpu"]]
    assert all(t.device.type == "cpu" for t in tensors)
    assert isinstance(back["param"], torch.nn.Parameter) and back["holder"].step == 7


def test_a_result_that_cannot_be_pickled_is_named():
    import threading

    with pytest.raises(ResultNotSent, match="cannot be pickled.*lock"):
        result_bytes([threading.Lock()])


# --- NVML: names and CUDA_VISIBLE_DEVICES, with a fake driver library -----------------------


class _FakeNVML:
    """The five NVML calls ``nvml`` makes, answering for three GPUs."""

    GPUS = [
        (b"NVIDIA H100", b"GPU-1111", 80 << 30),
        (b"Tesla T4", b"GPU-2222", 15 << 30),
        (b"Tesla T4", b"GPU-3333", 15 << 30),
    ]

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        return 0

    def nvmlDeviceGetCount_v2(self, count):  # count: ctypes.byref(c_uint); ._obj is the c_uint
        count._obj.value = len(self.GPUS)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = index + 1
        return 0

    def _write(self, buffer, text):
        buffer.value = text
        return 0

    def nvmlDeviceGetName(self, handle, buffer, size):
        return self._write(buffer, self.GPUS[handle.value - 1][0])

    def nvmlDeviceGetUUID(self, handle, buffer, size):
        return self._write(buffer, self.GPUS[handle.value - 1][1])

    def nvmlDeviceGetMemoryInfo(self, handle, memory):
        memory._obj.total = self.GPUS[handle.value - 1][2]
        return 0


@pytest.mark.parametrize(
    "visible, names",
    [
        (None, ["NVIDIA H100", "Tesla T4", "Tesla T4"]),
        ("2,0", ["Tesla T4", "NVIDIA H100"]),
        ("1,7,0", ["Tesla T4"]),  # CUDA stops at the first entry that names no GPU
        ("GPU-3333,GPU-1", ["Tesla T4", "NVIDIA H100"]),
        ("", []),
    ],
)
def test_nvml_names_the_gpus_cuda_would_number(monkeypatch, visible, names):
    monkeypatch.setattr(nvml, "_library", _FakeNVML)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # mixed models: CUDA numbers them as NVML does
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = nvml.visible_gpus()
    assert [g.name for g in found] == names
    assert all(g.memory_bytes in (80 << 30, 15 << 30) for g in found)


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "MIG-4d8a2c1e-0000-0000-0000-000000000000"},  # an instance, not a GPU
        {"CUDA_VISIBLE_DEVICES": "0,1"},  # mixed models, CUDA's default order: the fastest first
    ],
)
def test_nvml_leaves_to_cuda_what_it_may_number_differently(monkeypatch, env):
    """None (gpu_names then asks CUDA in a child process) rather than a name in the wrong place."""
    monkeypatch.setattr(nvml, "_library", _FakeNVML)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert nvml.visible_gpus() is None
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert (nvml.visible_gpus() is None) == env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")


def test_nvml_without_a_driver_says_so(monkeypatch):
    monkeypatch.setattr(nvml, "_library", lambda: None)
    assert nvml.visible_gpus() is None


def test_this_cpu_machine_has_no_gpu_and_stays_fork_safe():
    assert hardware.gpu_count() == 0 and hardware.gpu_names() == []
    assert not torch.cuda.is_initialized()
