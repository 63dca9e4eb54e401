"""Blocking ``dcp.save`` against ``dcp.async_save``: how long training stands still per checkpoint.

    python benchmarks/checkpoint.py                     # 2 ranks, a 200,000 x 64 table + Adagrad: ~102 MB
    python benchmarks/checkpoint.py --rows 1000000 --checkpoints 8
    python benchmarks/checkpoint.py --modeled         # on a modeled 8xH100 node and its storage: exact

Both runs train the same DDP model (``course_utils.checkpoint.background.train_big_table``) and
checkpoint it with an ``AppState`` every ``--every`` steps into a temporary folder (deleted
afterwards). Printed per mode: the size of one checkpoint, and for each checkpoint the time the
slowest rank spent in the save call (blocking: the whole ``dcp.save``; async: ``async_save``
until it returns), their median, the ratio of the medians, and for async the time spent first
waiting for the previous save when it was still being written (zero when the interval between
checkpoints is longer than one write). Each rank uses one thread; the figures depend on the
disk (every file is fsync'ed), on memory bandwidth (the staging copy) and on how busy the
machine is. With ``--modeled`` the same saves run on a modeled cluster (chapter 08, section 4):
their time is that of ``--storage`` (``course_utils.checkpoint.modeled_io.STORAGE``), the same on
every machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from functools import partial
from pathlib import Path

from course_utils import Cluster, launch
from course_utils.checkpoint.background import slowest_rank_stalls, train_big_table
from course_utils.checkpoint.modeled_io import STORAGE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the embedding table (dim 64)")
    parser.add_argument("--checkpoints", type=int, default=6)
    parser.add_argument("--every", type=int, default=40, help="training steps between checkpoints")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--modeled", action="store_true", help="time the saves on a modeled 8xH100 node")
    parser.add_argument("--storage", default="parallel-fs", choices=sorted(STORAGE), help="with --modeled")
    args = parser.parse_args()
    cluster = Cluster("h100", "nvlink") if args.modeled else None
    if cluster is not None:
        print(f"{cluster.label}; checkpoints to {STORAGE[args.storage].describe()}")
    digits = 3 if args.modeled else 0
    medians = {}
    with tempfile.TemporaryDirectory(prefix="checkpoint_bench_") as folder:
        for mode in ("blocking", "async"):
            run = partial(
                train_big_table,
                Path(folder) / mode,
                steps=args.checkpoints * args.every,
                checkpoint_every=args.every,
                mode=mode,
                rows=args.rows,
                storage=args.storage if args.modeled else None,
            )
            results = launch(run, world_size=args.ranks, timeout=600, cluster=cluster)
            stalls = slowest_rank_stalls(results)
            medians[mode] = statistics.median(stalls)
            print(
                f"{mode:8s}: checkpoints of {results[0]['checkpoint_bytes'] / 1e6:.1f} MB; in the save call "
                + ", ".join(f"{s * 1e3:.{digits}f}" for s in stalls)
                + f" ms; median {medians[mode] * 1e3:.{digits}f} ms"
            )
            if mode == "async":
                waited = slowest_rank_stalls(results, "waited")
                shown = ", ".join(f"{s * 1e3:.{digits}f}" for s in waited)
                print(f"          waiting first for the previous save: {shown} ms")
    print(f"async / blocking, medians: {medians['async'] / medians['blocking']:.2f}")


if __name__ == "__main__":
    main()
