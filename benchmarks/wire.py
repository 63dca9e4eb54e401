"""The modeled wire against its own model: each collective's measured time and the prediction.

    python benchmarks/wire.py                          # 6 operations, 2 and 4 ranks, 3 sizes
    python benchmarks/wire.py --ranks 2 --sizes-kb 64 --repeats 9

For each operation (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send/recv),
world size and message size, it times the call on plain gloo and under a wire (latency
``--alpha-ms``, bandwidth ``--beta-mbps``), and prints the medians, the model's prediction and
measured / predicted. Target (issue 21): wherever the model's time is at least 3x gloo's own,
the measured time is within 15 % of the prediction. It also measures the CPU a rank uses while
it waits on a one-second modeled all-reduce: target below 10 % of a core.

Each operation on a wire costs about 0.3-1.5 ms more than the model on a 2-core machine (the
stamp all-reduce, the lane thread's wake-up, handing the result back): hence the default
latency of 5 ms, at which that overhead stays inside the 15 %.
"""

from __future__ import annotations

import argparse
import os

import torch

from course_utils import Wire, launch
from course_utils.collectives.wire_check import (
    CHECKED,
    cpu_share_while_waiting,
    predicted_seconds,
    time_operations,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes-kb", type=float, nargs="+", default=[4, 256, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--alpha-ms", type=float, default=5.0)
    parser.add_argument("--beta-mbps", type=float, default=50.0, help="MB/s per rank")
    args = parser.parse_args()
    wire = Wire(latency_s=args.alpha_ms / 1e3, bandwidth_Bps=args.beta_mbps * 1e6, name="benchmark wire")
    sizes = [int(kb * 1024) for kb in args.sizes_kb]
    print(
        f"{wire.label}: alpha {args.alpha_ms} ms, beta {args.beta_mbps} MB/s  (torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, median of {args.repeats})"
    )
    print(
        f"{'op':>15} {'ranks':>5} {'size':>8} | {'gloo ms':>8} {'wire ms':>8} {'model ms':>8} "
        "| wire/model  checked"
    )
    checked = met = 0
    for w in args.ranks:
        plain = launch(time_operations, list(CHECKED), sizes, args.repeats, world_size=w, show_output=False)[
            0
        ]
        wired = launch(
            time_operations, list(CHECKED), sizes, args.repeats, world_size=w, wire=wire, show_output=False
        )[0]
        for p, m in zip(plain, wired, strict=True):
            model = predicted_seconds(wire, m["op"], m["nbytes"], w)
            ratio = m["seconds"] / model
            in_scope = model >= 3 * p["seconds"]
            ok = abs(ratio - 1) <= 0.15
            checked += in_scope
            met += in_scope and ok
            mark = ("ok" if ok else "MISSED") if in_scope else "-"
            print(
                f"{m['op']:>15} {w:>5} {m['nbytes'] // 1024:>6}KB | {p['seconds'] * 1e3:8.2f} "
                f"{m['seconds'] * 1e3:8.2f} {model * 1e3:8.2f} | {ratio:10.3f}  {mark}"
            )
    waiting = Wire(latency_s=1.0, bandwidth_Bps=1e9, name="one-second wire")
    shares = launch(cpu_share_while_waiting, world_size=2, wire=waiting, show_output=False)
    print(f"\nwithin 15 % of the model where it is >= 3x gloo's time: {met} of {checked}")
    print(
        f"CPU while waiting on a 1 s modeled all-reduce: {max(shares) * 100:.1f} % of a core (target < 10 %)"
    )


if __name__ == "__main__":
    main()
