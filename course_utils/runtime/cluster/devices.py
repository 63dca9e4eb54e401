"""The modeled GPUs: datasheet peaks, and the fractions of them a training step achieves.

A ``Device`` prices one kernel by a roofline (``roofline.py``):

    seconds = max(FLOPs / (peak FLOP/s x compute_efficiency),
                  bytes read and written / (memory bandwidth x memory_efficiency))
              + launch_s

* ``peak_flops``: dense peaks by the dtype the kernel computes in. float32 matrix products run on
  the plain FP32 units (PyTorch's default: ``torch.backends.cuda.matmul.allow_tf32`` is False);
  a ``Cluster(tf32=True)`` prices them at the TF32 tensor-core peak instead. A dtype the GPU has
  no tensor cores for (bfloat16 on T4 and V100) is priced at its FP32 peak.
* ``compute_efficiency`` 0.7: cuBLAS reaches about 70-80 % of the dense peak on large matrix
  products (NVIDIA, "Matrix Multiplication Background User's Guide", GPU performance
  background); small products reach less, which the roofline's memory side and the launch
  cost already show.
* ``memory_efficiency`` 0.8: element-wise kernels stream at about 80-90 % of the HBM peak
  (the STREAM-like copy kernels of NVIDIA's and AMD's bandwidth tests).
* ``launch_s`` 4 us: a kernel's fixed cost on the stream when PyTorch launches it eagerly, one
  kernel per operator (NVIDIA, "Getting Started with CUDA Graphs", 2019: back-to-back kernels of
  2.9 us each took 3.8 us apiece when launched one by one; eager PyTorch adds its dispatcher's
  few microseconds per operator on the host).
* ``sms``: streaming multiprocessors; a collective's NCCL kernels take some of them
  (``Wire.comm_sms``), and compute that overlaps it runs on the rest (``overlap_speed``).

Peaks and bandwidths are NVIDIA's datasheets (named in each preset's ``source``).

Taught in chapter 02 (the modeled cluster) and chapter 04 (compute against communication).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

__all__ = ["Device", "DEVICES", "device"]

DTYPES = ("float32", "tf32", "float16", "bfloat16")


@dataclass(frozen=True)
class Device:
    """One modeled GPU (see the module docstring for each field's meaning and source)."""

    name: str
    peak_flops: dict = field(default_factory=dict)  # {"float32": FLOP/s, "tf32", "float16", "bfloat16"}
    memory_bandwidth: float = 1e12  # bytes/s
    memory_bytes: int = 16 * 2**30
    sms: int = 80
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    launch_s: float = 4e-6
    source: str = ""

    def __post_init__(self):
        missing = [d for d in DTYPES if d not in self.peak_flops]
        if missing:
            raise ValueError(f"Device {self.name!r}: peak_flops needs {', '.join(missing)} (FLOP/s)")
        numbers = {
            "memory_bandwidth": self.memory_bandwidth,
            "compute_efficiency": self.compute_efficiency,
            "memory_efficiency": self.memory_efficiency,
            **{f"peak_flops[{k!r}]": v for k, v in self.peak_flops.items()},
        }
        for what, value in numbers.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"Device {self.name!r}: {what} must be a positive number, got {value!r}")
        if not (0 < self.compute_efficiency <= 1 and 0 < self.memory_efficiency <= 1):
            raise ValueError(f"Device {self.name!r}: efficiencies are fractions in (0, 1]")
        if self.launch_s < 0 or self.sms < 1:
            raise ValueError(
                f"Device {self.name!r}: needs launch_s >= 0 and sms >= 1, got {self.launch_s}, {self.sms}"
            )

    def flops_per_second(self, dtype: str) -> float:
        """The achieved FLOP/s for kernels computing in ``dtype`` ("float32", "tf32", ...)."""
        return self.peak_flops.get(dtype, self.peak_flops["float32"]) * self.compute_efficiency

    @property
    def bytes_per_second(self) -> float:
        """The achieved memory bandwidth, bytes/s."""
        return self.memory_bandwidth * self.memory_efficiency

    def replace(self, **changes) -> Device:
        """This device with some fields changed (``h100.replace(compute_efficiency=0.5)``)."""
        return dataclasses.replace(self, **changes)


def _peaks(fp32: float, tf32: float, fp16: float, bf16: float) -> dict:
    return {"float32": fp32 * 1e12, "tf32": tf32 * 1e12, "float16": fp16 * 1e12, "bfloat16": bf16 * 1e12}


#: NVIDIA's data-centre GPUs of the last four generations; dense peaks (without sparsity).
DEVICES: dict[str, Device] = {
    "t4": Device(
        name="T4",
        peak_flops=_peaks(8.1, 8.1, 65, 8.1),
        memory_bandwidth=320e9,
        memory_bytes=16 * 2**30,
        sms=40,
        source="NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 65 TFLOPS mixed FP16/FP32 tensor cores, "
        "16 GB GDDR6 at 320 GB/s, 40 SMs; no TF32 or BF16 tensor cores (Turing)",
    ),
    "v100": Device(
        name="V100 SXM2",
        peak_flops=_peaks(15.7, 15.7, 125, 15.7),
        memory_bandwidth=900e9,
        memory_bytes=32 * 2**30,
        sms=80,
        source="NVIDIA V100 datasheet (SXM2): 15.7 TFLOPS FP32, 125 TFLOPS tensor (FP16), "
        "32 GB HBM2 at 900 GB/s, 80 SMs; no TF32 or BF16 tensor cores (Volta)",
    ),
    "a100": Device(
        name="A100 SXM 80GB",
        peak_flops=_peaks(19.5, 156, 312, 312),
        memory_bandwidth=2039e9,
        memory_bytes=80 * 2**30,
        sms=108,
        source="NVIDIA A100 datasheet (SXM 80GB): 19.5 TFLOPS FP32, 156 TFLOPS TF32, 312 TFLOPS "
        "BF16/FP16 tensor cores (dense), 80 GB HBM2e at 2,039 GB/s, 108 SMs",
    ),
    "h100": Device(
        name="H100 SXM",
        peak_flops=_peaks(67, 494.5, 989.5, 989.5),
        memory_bandwidth=3.35e12,
        memory_bytes=80 * 2**30,
        sms=132,
        source="NVIDIA H100 datasheet (SXM): 67 TFLOPS FP32, 989 TFLOPS TF32 and 1,979 TFLOPS "
        "BF16/FP16 with sparsity (half without), 80 GB HBM3 at 3.35 TB/s, 132 SMs",
    ),
}


def device(name_or_device) -> Device:
    """A ``Device`` from a preset name ("h100", any case) or a ``Device`` itself."""
    if isinstance(name_or_device, Device):
        return name_or_device
    key = str(name_or_device).strip().lower()
    if key not in DEVICES:
        raise ValueError(
            f"unknown device {name_or_device!r}: choose one of {', '.join(DEVICES)}, or pass a Device"
        )
    return DEVICES[key]
