"""The time scale: how many seconds of this machine stand for one second of a GPU's work.

A lesson about overlap or bubbles depends on one ratio: computation per byte communicated.
A CPU core computes thousands of times slower than a GPU, so the network is slowed down by the
same factor to keep the ratio: ``s = G / C``, where

* ``G``: a GPU's *achieved* throughput on training work: 400 TFLOP/s, about 40 % of an H100's
  989 TFLOP/s dense BF16 peak (NVIDIA's H100 datasheet); Llama 3's training reports 38-43 %
  of peak (model FLOPs utilisation) on H100s (Dubey et al., "The Llama 3 Herd of Models",
  2024, table 4). A small recommendation MLP achieves less, so this flatters the GPU's side:
  the communication looks, if anything, cheaper than it would be.
* ``C``: this machine's measured throughput on the same kind of work, one thread: float32
  matrix products of a DLRM-sized MLP layer (``measure_flops``), the median of a few runs.

Then ``Wire.scaled(s)`` gives alpha x s and beta / s: both the latency-bound and the
bandwidth-bound lessons keep their real shape.

Taught in chapter 02 (the presets, scaled to this machine).
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["GPU_ACHIEVED_FLOPS", "measure_flops", "time_scale"]

GPU_ACHIEVED_FLOPS = 400e12  #: see the module docstring for the source

_measured: dict[str, float] = {}


def measure_flops(rows: int = 256, width: int = 512, repeats: int = 7) -> float:
    """This process's float32 matmul throughput (FLOP/s) on a ``(rows, width) @ (width, width)``
    product, one thread, median of ``repeats`` timings of 20 products each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(rows, width), torch.randn(width, width)
        a @ b  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(20):
                a @ b
            times.append((time.perf_counter() - start) / 20)
    finally:
        torch.set_num_threads(threads)
    return 2 * rows * width * width / statistics.median(times)


def time_scale() -> float:
    """``GPU_ACHIEVED_FLOPS / measure_flops()``, measured once per process (about 0.2 s)."""
    if "scale" not in _measured:
        _measured["scale"] = GPU_ACHIEVED_FLOPS / measure_flops()
    return _measured["scale"]
