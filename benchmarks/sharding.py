"""Embedding sharding on 2 and 4 ranks: bytes moved per step (measured vs formula) and step time.

    python benchmarks/sharding.py                 # 26 Criteo-shaped tables, 1/100 of their size
    python benchmarks/sharding.py --batch 4096 --steps 20

For each of table-wise, row-wise (range and hash split) and column-wise sharding, every
rank runs forward + backward of the sharded lookup on its own rows of synthetic click
logs (Zipf-distributed ids, as in Criteo). Printed per configuration: the bytes the
all-to-alls moved in one step, counted from the tensors sent, and the formula's figure
(they must agree exactly; the script fails otherwise), the median step time over
``--steps`` steps, and how unevenly the ids land on the ranks (row-wise range split sends
every hot id to rank 0). Each rank uses one thread; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics

from course_utils import launch, sharding
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
    parser.add_argument("--scale", type=float, default=1 / 100, help="fraction of Criteo's table sizes")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2048, help="rows per rank per step")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    cards = data.criteo_cardinalities(args.scale)
    print(
        f"{len(cards)} tables, {sum(cards):,} rows x dim {args.dim}; batch {args.batch} rows per rank; "
        f"median of {args.steps} steps (forward + backward)\n"
    )
    print(
        f"{'sharding':20s} {'W':>2s} {'measured B/step':>16s} {'formula B/step':>15s} {'step ms':>8s} "
        f"{'vs table-wise':>13s} {'ids per rank (max/mean)':>24s}"
    )
    for world in (2, 4):
        base = None
        for kind, options in CASES:
            results = launch(
                sharding.time_lookup_steps,
                kind,
                options,
                cards,
                args.dim,
                args.batch,
                args.steps,
                world_size=world,
                timeout=600,
                show_output=False,
            )
            per_rank_seconds = [r[0] for r in results]
            step = statistics.median(
                max(s) for s in zip(*per_rank_seconds, strict=False)
            )  # the slowest rank sets the pace
            measured = sharding.measured([r[1] for r in results])["total"]
            routed = results[0][2]
            expected = sharding.formula(kind, args.batch, len(cards), args.dim, world, routed=routed)["total"]
            if measured != expected:
                raise SystemExit(
                    f"{_name(kind, options)} on {world} ranks: measured {measured} B != formula {expected} B"
                )
            base = base or step
            if routed:
                received = [sum(row[s] for row in routed) for s in range(world)]
                balance = f"{max(received) / (sum(received) / world):.2f}"
            else:
                balance = "1.00" if kind == "column_wise" else "(whole tables)"
            print(
                f"{_name(kind, options):20s} {world:2d} {measured:16,d} {expected:15,d} {step * 1e3:8.1f} "
                f"{step / base:12.2f}x {balance:>24s}"
            )
        print()
    print("measured == formula for every configuration (exact)")


if __name__ == "__main__":
    main()
