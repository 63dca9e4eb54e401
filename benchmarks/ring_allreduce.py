"""Bus bandwidth of the ring all-reduces by hand (plain and tuned) against gloo's all_reduce.

    python benchmarks/ring_allreduce.py                     # 1, 16, 64 MB on 2 and 4 ranks, 9 repeats
    python benchmarks/ring_allreduce.py --ranks 2 --sizes-mb 16 --repeats 15

For each world size and message size, times ``dist.all_reduce`` (gloo),
``plain_ring_all_reduce`` (one message per chunk, a fresh buffer per step) and the
tuned ``ring_all_reduce`` (segments, two reused buffers) on the same float32 tensor,
alternating them repeat by repeat so that a busy moment on the machine hurts
all alike, and prints the median time and the bus bandwidth (algorithm bandwidth
bytes / time, times 2 (w - 1) / w, as nccl-tests defines it) of each, and the
ratios to gloo. Target: the tuned ring at least 0.6x of gloo at 16 MB and above.
Run it on a quiet machine (the first number of /proc/loadavg well below 1).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.collectives import bandwidth, plain_ring_all_reduce, ring_all_reduce

IMPLEMENTATIONS = {
    "gloo all_reduce": dist.all_reduce,
    "plain ring": plain_ring_all_reduce,
    "ring by hand": ring_all_reduce,
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    sizes = [int(mb * (1 << 20)) for mb in args.sizes_mb]

    print(
        f"all-reduce of float32 tensors, gloo on CPU  (torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"load average at start {_load()}, median of {args.repeats})"
    )
    print(
        f"{'ranks':>5} {'size':>7} | {'gloo ms':>8} {'busbw':>7} | {'plain ms':>8} {'busbw':>7} | "
        f"{'tuned ms':>8} {'busbw':>7} | plain/gloo tuned/gloo"
    )
    target_met = True
    for w in args.ranks:
        rows = launch(
            bandwidth.sweep,
            IMPLEMENTATIONS,
            sizes,
            args.repeats,
            world_size=w,
            backend="gloo",
            timeout=1800,
            show_output=False,
        )[0]
        by = {(r["name"], r["nbytes"]): r for r in rows}
        for n in sizes:
            g, p, r = by["gloo all_reduce", n], by["plain ring", n], by["ring by hand", n]
            ratio = r["busbw"] / g["busbw"]
            if n >= 16 << 20:
                target_met &= ratio >= 0.6
            print(
                f"{w:>5} {n / (1 << 20):>5g}MB | {g['seconds'] * 1e3:8.2f} {g['busbw'] / 1e9:7.3f} | "
                f"{p['seconds'] * 1e3:8.2f} {p['busbw'] / 1e9:7.3f} | "
                f"{r['seconds'] * 1e3:8.2f} {r['busbw'] / 1e9:7.3f} | "
                f"{p['busbw'] / g['busbw']:9.2f}x {ratio:9.2f}x"
            )
    print("bandwidths in GB/s (1e9 bytes/s); busbw = algbw * 2 (w - 1) / w")
    print(
        f"load average at end {_load()}; target ring/gloo >= 0.6x at 16 MB and above: "
        f"{'met' if target_met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
