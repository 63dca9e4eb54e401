"""By-hand DDP vs torch DDP: step time and parameters, 2 ranks, same DLRM, same data.

    python benchmarks/ddp_vs_torch.py [--steps 20] [--rounds 5] [--batch 1024] [--rows 40000]

Every rank runs naive, bucketed and torch DDP in turn, and bucketed DDP with one
bucket for all gradients (it can only leave when backward has finished: the same
few messages, no overlap), ``--rounds`` times
(interleaved, so a burst of load from elsewhere hits all three alike), each run
``--steps`` optimizer steps from the same initial weights on the same batches.
Prints the median step time of each (the first 2 steps of a run are warm-up and
not counted), the ratios bucketed / torch (target: <= 1.15) and naive / bucketed
(what bucketing plus overlap buys), one-bucket / bucketed (what overlap alone
buys), the largest parameter
difference after the last step between bucketed and torch DDP (target: <= 1e-5),
and what the overlap could buy at most: the all-reduce time of one step's
gradients alone, and the backward time alone. Run it on a quiet machine
(``cat /proc/loadavg``: first number below ~0.5); it prints the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.ddp import TrainSettings, max_difference
from course_utils.ddp.runs import VARIANTS, step_times
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig
from course_utils.workload.train import bce_loss


def _alone(model_config: DLRMConfig, logs, per_rank: int, repeats: int) -> dict:
    """Median seconds of one backward, and of one all_reduce of all gradients, each alone."""
    model = model_config.build(seed=0)
    batch = logs[:per_rank].to_torch()
    backward, comm = [], []
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        loss = bce_loss(model, batch)
        dist.barrier()
        start = time.perf_counter()
        loss.backward()
        backward.append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        comm.append(time.perf_counter() - start)
    return {
        "backward": statistics.median(backward[1:]),
        "all_reduce": statistics.median(comm[1:]),
        "gradient_bytes": flat.numel() * 4,
    }


def bench_rank(logs, model_config: DLRMConfig, settings: TrainSettings, rounds: int) -> dict:
    """On every rank: ``rounds`` x every variant (interleaved), then the backward and all_reduce alone."""
    times = step_times(logs, model_config, settings, variants=tuple(VARIANTS), rounds=rounds)
    alone = _alone(model_config, logs, settings.per_rank_batch(dist.get_world_size()), repeats=2 * rounds + 1)
    return {**times, "alone": alone}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1024, help="global batch (rows per step, all ranks)")
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--optimizer", default="adam")
    args = parser.parse_args(argv)

    logs = data.make_click_logs(args.rows, seed=0)
    model_config = DLRMConfig(logs.cardinalities)
    settings = TrainSettings(
        global_batch_size=args.batch,
        max_steps=args.steps,
        optimizer=args.optimizer,
        lr=1e-3 if args.optimizer.startswith("adam") else 0.05,
    )
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    print(
        f"DLRM {sum(model_config.cardinalities):,} embedding rows x {model_config.embedding_dim}, "
        f"{model_config.embedding_parameter_count() + model_config.dense_parameter_count():,} parameters; "
        f"2 ranks x {args.batch // 2} rows, {args.steps} steps x {args.rounds} rounds, {args.optimizer}"
    )
    per_rank = launch(
        bench_rank, logs, model_config, settings, args.rounds, world_size=2, timeout=600, show_output=False
    )
    medians = {name: statistics.median(t for r in per_rank for t in r["seconds"][name]) for name in VARIANTS}
    for name in VARIANTS:
        print(f"  {name:10s} DDP: median step {1e3 * medians[name]:7.2f} ms")
    ratio = medians["bucketed"] / medians["torch"]
    gain = medians["naive"] / medians["bucketed"]
    overlap = medians["one bucket"] / medians["bucketed"]
    diff = max_difference(per_rank[0]["states"]["bucketed"], per_rank[0]["states"]["torch"])
    alone = per_rank[0]["alone"]
    print(
        f"bucketed / torch step time: {ratio:.3f}  (target <= 1.15: {'met' if ratio <= 1.15 else 'NOT met'})"
    )
    print(
        f"naive / bucketed step time: {gain:.3f}  "
        f"(bucketing + overlap save {100 * (1 - 1 / gain):.1f}% of a naive step)"
    )
    print(
        f"one bucket / bucketed step time: {overlap:.3f}  "
        f"(overlap alone saves {100 * (1 - 1 / overlap):.1f}% "
        "of a step without it)"
    )
    print(
        f"max |bucketed - torch| parameter after {args.steps} steps: {diff:.2e}  "
        f"(target <= 1e-5: {'met' if diff <= 1e-5 else 'NOT met'})"
    )
    print(
        f"alone, per step: backward {1e3 * alone['backward']:.2f} ms, all_reduce of "
        f"{alone['gradient_bytes'] / 2**20:.2f} MiB of gradients {1e3 * alone['all_reduce']:.2f} ms "
        f"(the most overlap could hide is the smaller of the two)"
    )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
