"""How long it takes to start N ranks that each do one all_reduce, and exit.

    python benchmarks/launch_latency.py            # 4 ranks, 7 repeats
    python benchmarks/launch_latency.py --ranks 2 --repeats 11

Compares ``course_utils.launch`` (torchrun's elastic engine, fork start) with
``torch.multiprocessing.spawn`` (fresh interpreters, the classic tutorial way),
and, for reference, ``launch`` forced to the spawn start method. Prints the
median wall time of each and the ratio. Target on a 2-core laptop-class CPU:
``launch`` at least 5x faster than ``mp.spawn`` and under 1 s for 4 ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_utils import launch
from course_utils.collectives import free_port
from course_utils.runtime import examples


def _spawned_rank(rank: int, world_size: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    examples.sum_of_ranks()
    dist.destroy_process_group()


def time_launch(ranks: int, start_method: str) -> float:
    start = time.perf_counter()
    results = launch(examples.sum_of_ranks, world_size=ranks, start_method=start_method, show_output=False)
    took = time.perf_counter() - start
    assert results == [float(sum(range(ranks)))] * ranks
    return took


def time_mp_spawn(ranks: int) -> float:
    start = time.perf_counter()
    mp.spawn(_spawned_rank, args=(ranks, free_port()), nprocs=ranks, join=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    time_launch(args.ranks, "fork")  # warm-up: imports, first-use costs
    runs = {
        "launch (fork, elastic engine)": [time_launch(args.ranks, "fork") for _ in range(args.repeats)],
        "launch (spawn, elastic engine)": [time_launch(args.ranks, "spawn") for _ in range(3)],
        "torch.multiprocessing.spawn": [time_mp_spawn(args.ranks) for _ in range(max(3, args.repeats // 2))],
    }
    print(
        f"Start {args.ranks} ranks, one all_reduce each, exit  (torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs)"
    )
    medians = {}
    for name, times in runs.items():
        medians[name] = statistics.median(times)
        print(
            f"  {name:32s} median {medians[name]:6.3f} s   (n={len(times)}, "
            f"min {min(times):.3f}, max {max(times):.3f})"
        )
    ours, theirs = medians["launch (fork, elastic engine)"], medians["torch.multiprocessing.spawn"]
    print(
        f"  mp.spawn / launch = {theirs / ours:.1f}x   (target >= 5x; launch target < 1 s: "
        f"{'met' if ours < 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
