"""GPU names and memory read through NVML, the driver's management library, without touching CUDA.

Asking CUDA anything (``torch.cuda.get_device_name``, even
``torch.cuda.is_available()`` without ``PYTORCH_NVML_BASED_CUDA_CHECK=1``)
initialises the CUDA driver in this process, and a process that has done so
can no longer fork workers that use CUDA ("Cannot re-initialize CUDA in forked
subprocess"). NVML (``libnvidia-ml.so.1``, what ``nvidia-smi`` reads) answers
the same questions and leaves the process fork-safe. torch counts GPUs this
way too (``torch.cuda._device_count_nvml``); this module adds their names.

Taught in chapter 00. Only ``visible_gpus`` is meant to be called.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE


@dataclass(frozen=True)
class GPUInfo:
    """One GPU as NVML reports it: its name, UUID and total memory in bytes."""

    name: str
    uuid: str
    memory_bytes: int


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _library():
    """The NVML shared library, or None where there is no NVIDIA driver."""
    try:
        return ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None


def _all_gpus(lib) -> list[GPUInfo]:
    """Every GPU the driver knows, in NVML's (PCI bus) order; raises OSError if NVML fails."""

    def check(code: int, what: str):
        if code != 0:
            raise OSError(f"NVML {what} failed with code {code}")

    check(lib.nvmlInit_v2(), "init")
    try:
        count = ctypes.c_uint()
        check(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "device count")
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            check(lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "handle")
            name, uuid, memory = (
                ctypes.create_string_buffer(_BUFFER),
                ctypes.create_string_buffer(_BUFFER),
                _Memory(),
            )
            check(lib.nvmlDeviceGetName(handle, name, _BUFFER), "name")
            check(lib.nvmlDeviceGetUUID(handle, uuid, _BUFFER), "uuid")
            check(lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)), "memory")
            gpus.append(GPUInfo(name.value.decode(), uuid.value.decode(), int(memory.total)))
        return gpus
    finally:
        lib.nvmlShutdown()


def _visible(gpus: list[GPUInfo], setting: str | None) -> list[GPUInfo]:
    """The GPUs a CUDA process sees under ``CUDA_VISIBLE_DEVICES=setting``, in CUDA's numbering.

    Unset: all of them. Otherwise a comma-separated list of indices or UUID
    prefixes; as in CUDA, the list stops at the first entry that names no GPU.
    """
    if setting is None:
        return list(gpus)
    chosen: list[GPUInfo] = []
    for entry in (e.strip() for e in setting.split(",")):
        if entry.lstrip("-").isdigit():
            match = gpus[int(entry)] if 0 <= int(entry) < len(gpus) else None
        else:
            match = next((g for g in gpus if entry and g.uuid.startswith(entry)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def visible_gpus() -> list[GPUInfo] | None:
    """The GPUs this process's CUDA would number ``cuda:0, cuda:1, ...``; None if NVML can't say.

    Honours ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs). Does not initialise
    CUDA, so the process can still fork CUDA workers afterwards. None also where NVML's
    answer may not be CUDA's: a MIG instance in ``CUDA_VISIBLE_DEVICES`` (NVML lists whole
    GPUs), or GPUs of different models without ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA numbers
    the fastest first, NVML by PCI bus).
    """
    lib = _library()
    setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    if lib is None or any(e.strip().startswith("MIG-") for e in (setting or "").split(",")):
        return None
    try:
        gpus = _all_gpus(lib)
    except (OSError, AttributeError):
        return None
    if len({g.name for g in gpus}) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None
    return _visible(gpus, setting)
