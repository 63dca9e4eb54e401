"""Published NCCL all-reduce bandwidths on real GPU nodes, to hold the modeled cluster against.

Each figure is nccl-tests' ``all_reduce_perf`` at sizes of gigabytes (its peak), as NCCL's
maintainer stated it on the project's tracker, with the page it comes from. ``model_error`` gives
the modeled figure's relative error against the published one (positive: the model is faster).

* 8xH100 SXM, NVLink 4 (450 GB/s each way per GPU): "with the protocol overhead (~20%) NCCL can
  get an effective NVLink bandwidth of 370GB/s", the bus bandwidth of a ring
  (``NCCL_ALGO=Ring``); NCCL's default there, NVLink SHARP (NVLS, the NVSwitch adds the GPUs'
  data itself), peaks at "~480GB/s (algbw ~275GB/s)", and "256M is too small to reach peak
  bandwidth" (github.com/NVIDIA/nccl-tests/issues/212). A user's 8xH100 SXM at 2 to 4 GB shows
  the same two figures, 365-370 and 480 GB/s (github.com/NVIDIA/nccl/issues/1455).
* 8xA100 SXM, NVLink 3 (twelve links of 25 GB/s each way, 300 GB/s): about 230 GB/s at 8 GiB
  (github.com/NVIDIA/nccl-tests/issues/149); a user's node measured 232.5 GB/s
  (github.com/NVIDIA/nccl-tests/issues/175).

Taught in chapter 02 (appendix 02b, section 2e, the model against a real node) and appendix 02a (section 3).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Published", "NCCL_ALL_REDUCE", "model_error"]


@dataclass(frozen=True)
class Published:
    """One published all-reduce figure: ``ranks`` GPUs of ``node``, NCCL's ``algorithm``, the bus
    bandwidth (GB/s) and, where stated, the algorithm bandwidth, at ``nbytes``; ``line_rate``:
    the link's datasheet bandwidth per GPU and direction (GB/s); ``source``: where it is stated."""

    node: str
    algorithm: str
    busbw_GBps: float  # noqa: N815 (the unit's capital B)
    algbw_GBps: float | None  # noqa: N815
    ranks: int
    nbytes: int
    line_rate_GBps: float  # noqa: N815
    source: str


NCCL_ALL_REDUCE = (
    Published("8xH100 SXM, NVLink 4", "Ring", 370, None, 8, 8 << 30, 450, "nccl-tests#212"),
    Published("8xH100 SXM, NVLink 4", "NVLS (default)", 480, 275, 8, 8 << 30, 450, "nccl-tests#212"),
    Published("8xA100 SXM, NVLink 3", "default", 230, None, 8, 8 << 30, 300, "nccl-tests#149"),
)


def model_error(modeled: float, published: float) -> float:
    """``modeled / published - 1``: +0.21 means the model is 21 % faster (more bandwidth)."""
    if published <= 0:
        raise ValueError(f"a published figure must be positive, got {published!r}")
    return modeled / published - 1
