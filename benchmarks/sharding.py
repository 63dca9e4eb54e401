"""Embedding sharding on a modeled 8xH100 node: bytes per step (measured vs formula) and step times.

    python benchmarks/sharding.py                       # 2, 4 and 8 ranks, Criteo's tables at full size
    python benchmarks/sharding.py --dim 64 --batch 4096 --network infiniband

For each of table-wise, row-wise (range and hash split) and column-wise sharding, every rank
runs one forward + backward of the sharded lookup on its own ``--batch`` rows of synthetic click
logs (Zipf-distributed ids, as in Criteo) on a modeled cluster (``course_utils.Cluster``): the
tables and vectors on the meta device, real sizes priced in virtual time, the ids real. Printed
per configuration: the bytes the all-to-alls moved, counted from the tensors sent, and the
formula's figure (they must agree exactly; the script fails otherwise), the busiest rank's bytes,
the modeled step time and its ratio to table-wise's, and how unevenly the ids land on the ranks
(a row-wise range split sends every hot id to rank 0). The times are exact: the same on every
machine and under any load.
"""

from __future__ import annotations

import argparse

from course_utils import Cluster, launch, sharding
from course_utils.workload import data

CASES = [
    ("table_wise", {}),
    ("row_wise", {"split": "range"}),
    ("row_wise", {"split": "hash"}),
    ("column_wise", {}),
]


def _name(kind: str, options: dict) -> str:
    return kind.replace("_", "-") + (f" ({options['split']})" if options else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of Criteo's table sizes")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8192, help="rows per rank per step")
    parser.add_argument(
        "--device", default="h100", help="a device preset (course_utils.runtime.cluster.DEVICES)"
    )
    parser.add_argument("--network", default="nvlink", help="a network preset (NETWORKS)")
    args = parser.parse_args()
    cards = data.criteo_cardinalities(args.scale) if args.scale != 1 else data.CRITEO_KAGGLE_CARDINALITIES
    node = Cluster(args.device, args.network)
    print(
        f"{node.label}: {node.network.describe()}\n{len(cards)} tables, {sum(cards):,} rows x dim "
        f"{args.dim}; batch {args.batch} rows per rank; one step (forward + backward)\n"
    )
    print(
        f"{'sharding':20s} {'W':>2s} {'measured B/step':>16s} {'formula B/step':>15s} "
        f"{'busiest rank B':>15s} {'step ms':>8s} {'vs table-wise':>13s} {'ids per rank (max/mean)':>24s}"
    )
    for world in (2, 4, 8):
        base = None
        for kind, options in CASES:
            results = launch(
                sharding.modeled_lookup_step,
                kind,
                options,
                cards,
                args.dim,
                args.batch,
                world_size=world,
                cluster=node,
                timeout=600,
                show_output=False,
            )
            traffic = [r["traffic"] for r in results]
            measured = sharding.measured(traffic)["total"]
            routed = results[0]["routed"]
            expected = sharding.formula(kind, args.batch, len(cards), args.dim, world, routed=routed)["total"]
            if measured != expected:
                raise SystemExit(
                    f"{_name(kind, options)} on {world} ranks: measured {measured} B != formula {expected} B"
                )
            step = results[0]["step_ns"] / 1e6
            base = base or step
            if routed:
                received = [sum(row[s] for row in routed) for s in range(world)]
                balance = f"{max(received) / (sum(received) / world):.2f}"
            else:
                balance = "1.00" if kind == "column_wise" else "(whole tables)"
            print(
                f"{_name(kind, options):20s} {world:2d} {measured:16,d} {expected:15,d} "
                f"{sharding.busiest_rank_bytes(traffic):15,d} {step:8.3f} {step / base:12.2f}x {balance:>24s}"
            )
        print()
    print("measured == formula for every configuration (exact)")


if __name__ == "__main__":
    main()
