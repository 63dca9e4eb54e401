"""By-hand DDP vs PyTorch's DDP: step times on a modeled GPU cluster, and the same parameters.

    python benchmarks/ddp_vs_torch.py [--cluster t4:pcie-gen3] [--rows 512] [--wall]

On a modeled cluster (``COURSE_CLUSTER``'s syntax, ``DEVICE:NETWORK[:GPUS_PER_NODE]``; default
Kaggle's two T4s on PCIe Gen3) every rank runs one timed step of naive, bucketed, one-bucket and
PyTorch's DDP on the dense part of MLPerf's DLRM (``overlap.step_profile``, virtual time: exact,
the same on every machine) and prints each step, the share of its communication hidden behind
backward, and the ratios bucketed / torch (target: <= 1.15), naive / bucketed (what bucketing and
overlap buy) and one bucket / bucketed (what overlap alone buys). Then both DDPs train the course's
small DLRM for real, 20 SGD steps on 2 ranks, and it prints the largest parameter difference
between them (target: <= 1e-5).

``--wall`` times the variants with this machine's clock instead (``overlap.step_seconds``, a tower
of square layers, the median of several steps): meaningful on GPUs, where each rank has its own
device; on two shared CPU cores it measures core contention.
"""

from __future__ import annotations

import argparse

from course_utils import Cluster, launch
from course_utils.ddp import TrainSettings, ddp_worker, max_difference, overlap
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig

ONE_BUCKET = {"bucket_cap_mb": 1024.0, "first_bucket_cap_mb": 1024.0}
VARIANTS = {
    "none": ("none", {}),
    "naive": ("naive", {}),
    "bucketed": ("bucketed", {}),
    "one bucket": ("bucketed", ONE_BUCKET),
    "torch": ("torch", {}),
}


def _ratios(steps: dict) -> list[str]:
    ratio, gain = steps["bucketed"] / steps["torch"], steps["naive"] / steps["bucketed"]
    overlap_gain = steps["one bucket"] / steps["bucketed"]
    return [
        f"bucketed / torch step: {ratio:.3f}  (target <= 1.15: {'met' if ratio <= 1.15 else 'NOT met'})",
        f"naive / bucketed step: {gain:.3f}  (bucketing and overlap save {1 - 1 / gain:.1%} of a naive step)",
        f"one bucket / bucketed step: {overlap_gain:.3f}  (overlap alone saves {1 - 1 / overlap_gain:.1%})",
    ]


def on_cluster(cluster: Cluster, rows: int) -> None:
    step = launch(overlap.step_profile, VARIANTS, overlap.MLPERF_DLRM, rows, world_size=2, cluster=cluster)[0]
    print(f"{cluster.label}: MLPerf's DLRM, dense part, {rows} rows per GPU, virtual time")
    for name, s in step.items():
        hidden = (
            f", {s['hidden_ns'] / s['communication_ns']:.0%} of its communication hidden"
            if s["all_reduces"]
            else ""
        )
        print(f"  {name:10s}: step {s['step_ns'] / 1e3:9,.1f} us, {s['all_reduces']:2d} all-reduces{hidden}")
    for line in _ratios({name: s["step_ns"] for name, s in step.items()}):
        print(line)


def on_this_machine() -> None:
    result = launch(overlap.step_seconds, VARIANTS, 1024, 8, 1024, 6, 3, world_size=2, timeout=600)[0]
    print("this machine's clock: a tower of 8 layers of 1024, 1024 rows per rank, median of 18 steps")
    for name, seconds in result["seconds"].items():
        print(f"  {name:10s}: step {seconds * 1e3:8.2f} ms")
    for line in _ratios(result["seconds"]):
        print(line)


def same_parameters(steps: int = 20) -> None:
    logs = data.make_click_logs(20_000, seed=0)
    config = DLRMConfig(logs.cardinalities)
    settings = TrainSettings(global_batch_size=1024, max_steps=steps, optimizer="sgd", lr=0.1)

    def both():
        return {kind: ddp_worker(kind, logs, config, settings).state for kind in ("bucketed", "torch")}

    states = launch(both, world_size=2, timeout=600, show_output=False)[0]
    diff = max_difference(states["bucketed"], states["torch"])
    print(
        f"max |bucketed - torch| parameter after {steps} SGD steps: {diff:.2e}  "
        f"(target <= 1e-5: {'met' if diff <= 1e-5 else 'NOT met'})"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="t4:pcie-gen3", help="DEVICE:NETWORK[:GPUS_PER_NODE]")
    parser.add_argument("--rows", type=int, default=512, help="rows per GPU")
    parser.add_argument("--wall", action="store_true", help="this machine's clock instead of a cluster")
    args = parser.parse_args(argv)
    if args.wall:
        on_this_machine()
    else:
        on_cluster(Cluster.from_env(args.cluster), args.rows)
    same_parameters()


if __name__ == "__main__":
    main()
