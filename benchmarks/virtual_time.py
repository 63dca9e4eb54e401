"""The modeled cluster's times against values written out by hand, and what the model costs.

    python benchmarks/virtual_time.py            # every check at 2 and 4 ranks, then the overhead
    python benchmarks/virtual_time.py --no-overhead

Part 1 runs all_reduce, all_gather, reduce_scatter, broadcast, all_to_all and send/recv at 2 and 4
ranks and three sizes, on a network and a GPU with round numbers (alpha 10 us, beta 10 GB/s; 100
TFLOP/s, no launch cost), four ways:

* ``together``: every rank arrives at once;
* ``late``: rank r first computes r matrix products of 20 us each, so the operation starts when
  the last rank arrives, (w-1) x 20 us later;
* ``queued``: two operations issued back to back without waiting: the second starts when the
  first ends (one stream per group; for messages, one queue per peer);
* ``overlap``: compute beside an all-reduce on a GPU whose NCCL kernels hold a quarter of the SMs
  runs at 3/4 of its speed.

Every modeled time (each rank's clock after the operation, less its clock before) is compared
with the time written out below from the algorithms' formulas, by hand, not with the package's
own model function; the script exits 1 if any differs by more than 1e-9 relative.

Part 2 measures what virtual time costs in wall time on this machine: the dispatch mode per
operator, and a chapter-sized DDP step with and without the cluster (medians; these vary with the
machine and its load, the modeled times above do not).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime.cluster import Cluster, Device, Wire, modeled_ns

ALPHA_NS = 10_000  # 10 us per message
BETA = 10e9  # bytes per second: n bytes take n / 10 ns
MATMUL_NS = 20_000  # a [1000, 1000] @ [1000, 1000] product: 2e9 FLOP at 100 TFLOP/s = 20 us
SIZES = (4_000, 400_000, 40_000_000)  # bytes; every n/(w beta) below is a whole number of ns

GPU = Device(
    name="benchmark GPU (100 TFLOP/s, no launch cost)",
    peak_flops={"float32": 100e12, "tf32": 100e12, "float16": 100e12, "bfloat16": 100e12},
    memory_bandwidth=1e15,
    compute_efficiency=1.0,
    memory_efficiency=1.0,
    launch_s=0.0,
    sms=100,
)
NETWORK = Wire(latency_s=ALPHA_NS / 1e9, bandwidth_Bps=BETA, name="benchmark network", comm_sms=0)
SHARED = Wire(
    latency_s=ALPHA_NS / 1e9, bandwidth_Bps=BETA, name="benchmark network, NCCL on 25 SMs", comm_sms=25
)


def by_hand(op: str, n: int, w: int) -> int:
    """Nanoseconds of ``op`` on ``n`` bytes at ``w`` ranks, written out from each algorithm."""
    per = lambda nbytes: nbytes // 10  # noqa: E731  (bytes -> ns at 10 GB/s)
    if op == "all_reduce":  # ring: reduce-scatter then all-gather, 2(w-1) steps of n/w bytes
        return 2 * (w - 1) * (ALPHA_NS + per(n // w))
    if op in ("all_gather", "reduce_scatter"):  # ring: w-1 steps of n/w bytes (n: the whole tensor)
        return (w - 1) * (ALPHA_NS + per(n // w))
    if op == "broadcast":  # binomial tree: ceil(log2 w) rounds of the whole tensor
        return math.ceil(math.log2(w)) * (ALPHA_NS + per(n))
    if op == "all_to_all":  # direct: w-1 messages at once, the bytes that leave the rank
        return (w - 1) * ALPHA_NS + per(n - n // w)
    if op == "send":
        return ALPHA_NS + per(n)
    raise ValueError(op)


def _issue(op: str, n: int):
    """A function that issues ``op`` once on this rank's tensors of ``n`` bytes (float32) and
    returns its work (or None where this rank takes no part)."""
    w, me = dist.get_world_size(), dist.get_rank()
    full, part = torch.ones(n // 4), torch.ones(n // 4 // w)
    parts, out = [torch.ones(n // 4 // w) for _ in range(w)], torch.ones(n // 4)
    calls = {
        "all_reduce": lambda: dist.all_reduce(full, async_op=True),
        "all_gather": lambda: dist.all_gather(parts, part, async_op=True),
        "reduce_scatter": lambda: dist.reduce_scatter(part, list(full.chunk(w)), async_op=True),
        "broadcast": lambda: dist.broadcast(full, src=0, async_op=True),
        "all_to_all": lambda: dist.all_to_all_single(out, full, async_op=True),
        "send": lambda: dist.isend(full, 1) if me == 0 else (dist.irecv(full, 0) if me == 1 else None),
    }
    return calls[op]


def measure(ops: list[str], sizes: list[int]) -> list[dict]:
    """On every rank: the modeled ns each case took on this rank (its clock after, less before)."""
    me = dist.get_rank()
    a = torch.ones(1000, 1000)
    rows = []
    for op in ops:
        for n in sizes:
            issue = _issue(op, n)
            for case in ("together", "late", "queued"):
                dist.barrier()
                start = modeled_ns()
                if case == "late":
                    for _ in range(me):
                        a @ a
                works = [issue() for _ in range(2 if case == "queued" else 1)]
                for work in works:
                    if work is not None:
                        work.wait()
                rows.append({"op": op, "bytes": n, "case": case, "rank": me, "ns": modeled_ns() - start})
    return rows


def expected(op: str, n: int, w: int, case: str, rank: int) -> int | None:
    """The ns ``rank`` should see, by hand; None where the rank takes no part."""
    t = by_hand(op, n, w)
    if op == "send":  # rank 0 sends to rank 1; the others take no part
        if rank > 1:
            return None
        if case == "late" and rank == 1:  # the receiver computed 20 us first; the message left at 0
            return max(MATMUL_NS, t)
        if case == "queued":
            return 2 * t  # the second message waits for the first on the 0 -> 1 queue
        return t
    last_arrival = (w - 1) * MATMUL_NS if case == "late" else 0
    return last_arrival + (2 * t if case == "queued" else t)


def measure_overlap() -> dict:
    """All-reduce 400 KB (60 us at 2 ranks) issued, then 4 products (80 us) beside it, then wait."""
    full, a = torch.ones(100_000), torch.ones(1000, 1000)
    dist.barrier()
    start = modeled_ns()
    work = dist.all_reduce(full, async_op=True)
    for _ in range(4):
        a @ a
    work.wait()
    return {"rank": dist.get_rank(), "ns": modeled_ns() - start}


def check_part_1() -> bool:
    ops = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send"]
    print(
        f"{NETWORK.name}, {GPU.name}\n{'op':>15} {'ranks':>5} {'bytes':>11} {'case':>9}  modeled ns = by hand"
    )
    bad = 0
    for w in (2, 4):
        ranks = launch(
            measure, ops, list(SIZES), world_size=w, cluster=Cluster(GPU, NETWORK), show_output=False
        )
        for rows in zip(*ranks, strict=True):
            op, n, case = rows[0]["op"], rows[0]["bytes"], rows[0]["case"]
            for row in rows:
                want = expected(op, n, w, case, row["rank"])
                if want is not None and abs(row["ns"] - want) > 1e-9 * want:
                    bad += 1
                    print(f"  MISMATCH rank {row['rank']}: {row['ns']} ns, by hand {want} ns")
            seen = sorted({r["ns"] for r in rows if expected(op, n, w, case, r["rank"]) is not None})
            print(f"{op:>15} {w:>5} {n:>11,} {case:>9}  {', '.join(f'{s:,}' for s in seen)}")
    # overlap: 60 us of all-reduce beside 80 us of compute at 3/4 speed: 80 + 60 x (4/3 - 1) = 100 us
    overlap = launch(measure_overlap, world_size=2, cluster=Cluster(GPU, SHARED), show_output=False)
    want = 4 * MATMUL_NS + 60_000 // 3
    for row in overlap:
        if row["ns"] != want:
            bad += 1
            print(f"  MISMATCH overlap rank {row['rank']}: {row['ns']} ns, by hand {want} ns")
    print(f"{'overlap':>15} {2:>5} {400_000:>11,} {'beside':>9}  {overlap[0]['ns']:,} (by hand {want:,})")
    print(f"part 1: {'every modeled time equals its value by hand' if not bad else f'{bad} mismatches'}")
    return bad == 0


def mode_overhead(ops: int = 3000) -> tuple[float, float]:
    """Wall seconds per small operator (a 1-element add), with and without the dispatch mode."""
    from course_utils.runtime import cluster

    t = torch.zeros(1)
    times = {}
    for modeled in (False, True):
        if modeled:
            cluster.install(Cluster("h100", "nvlink"))
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(ops):
                t.add_(1)
            runs.append((time.perf_counter() - start) / ops)
        times[modeled] = statistics.median(runs)
        if modeled:
            cluster.uninstall()
    return times[False], times[True]


def ddp_step(steps: int = 12) -> float:
    """On every rank: the median wall seconds of a DDP step of chapter 04's tower (8 x 512)."""
    from torch import nn

    from course_utils.ddp.overlap import tower

    model = nn.parallel.DistributedDataParallel(tower(512, 8))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512), torch.randn(256, 1)
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls[2:])


def part_2() -> None:
    plain, modeled = mode_overhead()
    print(
        f"dispatch mode: {plain * 1e6:.1f} us per operator without, {modeled * 1e6:.1f} us with "
        f"(+{(modeled - plain) * 1e6:.1f} us per operator)"
    )
    without = statistics.median(launch(ddp_step, world_size=2, show_output=False))
    with_cluster = statistics.median(
        launch(ddp_step, world_size=2, cluster=Cluster("h100", "nvlink"), show_output=False)
    )
    print(
        f"DDP step of chapter 04's tower on 2 ranks: {without * 1e3:.1f} ms on gloo, "
        f"{with_cluster * 1e3:.1f} ms on the modeled cluster ({with_cluster / without:.2f}x)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-overhead", action="store_true", help="skip part 2 (wall-clock overhead)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}")
    ok = check_part_1()
    if not args.no_overhead:
        part_2()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
