"""Streaming parquet row groups vs reading a rank's whole share into memory: peak RSS and samples/s.

    python benchmarks/data_loading.py [--sizes 1000000 10000000] [--repeats 3] [--batch 4096] [--epochs 1]

Writes synthetic click logs (``data.make_click_logs``, 13 dense + 26 sparse columns, about
270 bytes a row) to parquet files in a temporary folder, one row group of ``--group-rows``
rows at a time (in a child process, so this one stays small), with a row-group count that is
a multiple of 2. Then, for each size, ``--repeats`` times, each mode on 2 ranks
(``course_utils.launch``, fresh rank processes every time), the two modes interleaved:

* ``streaming``: ``ParquetBatches`` reads a row group when the loop needs its rows;
* ``in-memory``: ``ParquetBatches(in_memory=True)`` reads the rank's whole share at the first
  batch and keeps it (the reading is inside the timed first epoch: that is what the mode costs;
  with ``--epochs 2`` or more, later epochs reuse it while streaming reads every epoch again).

What is measured: **the data pipeline feeding a tiny training step**, not the course's DLRM.
Each rank runs ``--epochs`` epochs (default 1) of the course's training loop
(``course_utils.workload.train.fit``: batches to the device, loss, backward, optimizer step, losses
averaged over the ranks) on its own row groups, with a logistic regression on the 13 dense
columns wrapped in torch DDP (one all-reduce of 14 gradients per step), so that the loader,
not the model, is what is timed. The DLRM's own
step is about 20x slower per row on a CPU and would hide the loader entirely.

samples/s: rows trained on by both ranks / the slower rank's wall time of the epochs.
Peak RSS: read inside each rank: its high-water mark is reset when the rank starts
(``/proc/self/clear_refs``), so ``ru_maxrss`` afterwards is the peak of this run alone; the
rank's RSS at that moment (the interpreter, torch, pages shared with this process) is shown too.
Medians of the repeats; RSS is the larger of the two ranks.

Exits 1 unless, at the largest size, the streaming peak RSS is within 20% of its peak at the
smallest size, streaming samples/s is at least 90% of in-memory's at every size, and both modes
trained on the same batches (identical losses).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_utils import launch
from course_utils.workload import data
from course_utils.workload.data import rank_loader
from course_utils.workload.train import fit

WORLD = 2
MODES = {"streaming": False, "in-memory": True}


def write_file(path: str, rows: int, group_rows: int) -> None:
    """The synthetic file: ``rows`` rows in an even number of row groups, written one group at a time."""
    groups = -(-rows // group_rows)
    groups += groups % WORLD
    bounds = np.linspace(0, rows, groups + 1).round().astype(int)
    data.write_row_groups(
        (
            data.make_click_logs(int(hi - lo), seed=0, first_row=int(lo))
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)
        ),
        path,
    )


class TinyStep(nn.Module):
    """Logistic regression on the dense columns: ``(dense, sparse) -> logit``; the ids are read, not used."""

    def __init__(self, n_dense: int = 13):
        super().__init__()
        self.linear = nn.Linear(n_dense, 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.linear(dense).squeeze(1)


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def rank_run(path: str, in_memory: bool, batch_size: int, epochs: int = 1) -> dict:
    """The epochs on this rank; its peak RSS from the start of this function."""
    with open("/proc/self/clear_refs", "w") as refs:  # reset the high-water mark to the current RSS
        refs.write("5")
    start = _rss_mib()
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyStep())
    loader = rank_loader(path, dist.get_rank(), dist.get_world_size(), batch_size, in_memory=in_memory)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    history = fit(model, loader, optimizer, epochs=epochs, distributed=True)
    return {
        "samples": history.samples,
        "seconds": history.seconds,
        "loss": sum(history.step_loss),
        "steps": len(history.step_loss),
        "start_mib": start,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4096, help="rows per rank per step")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--group-rows", type=int, default=1 << 16, help="rows per parquet row group")
    parser.add_argument("--write", nargs=2, metavar=("PATH", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:
        write_file(args.write[0], int(args.write[1]), args.group_rows)
        return 0

    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    runs = {(n, mode): [] for n in args.sizes for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="data_loading_") as folder:
        paths = {}
        for n in args.sizes:
            paths[n] = str(Path(folder) / f"clicks_{n}.parquet")
            subprocess.run(
                [sys.executable, __file__, "--write", paths[n], str(n), "--group-rows", str(args.group_rows)],
                check=True,
            )
            info = data.parquet_info(paths[n])
            print(
                f"{n:>11,} rows: {info['row_groups']} row groups, "
                f"{os.path.getsize(paths[n]) / 2**20:,.0f} MiB on disk"
            )
        for _ in range(args.repeats):
            for n in args.sizes:
                for mode, in_memory in MODES.items():
                    ranks = launch(
                        rank_run,
                        paths[n],
                        in_memory,
                        args.batch,
                        args.epochs,
                        world_size=WORLD,
                        timeout=600,
                        show_output=False,
                    )
                    runs[n, mode].append(ranks)

    print(
        f"\n{WORLD} ranks, {args.batch} rows per rank per step, {args.epochs} epoch(s); "
        f"medians of {args.repeats}"
    )
    print(
        f"{'rows':>11} {'mode':>10} {'samples/s':>11} {'peak RSS MiB':>13} {'RSS at start':>13} {'steps':>6}"
    )
    table = {}
    for (n, mode), repeats in runs.items():
        speed = statistics.median(r[0]["samples"] / max(x["seconds"] for x in r) for r in repeats)
        peak = statistics.median(max(x["peak_mib"] for x in r) for r in repeats)
        start = statistics.median(max(x["start_mib"] for x in r) for r in repeats)
        table[n, mode] = speed, peak
        steps = repeats[0][0]["steps"]
        print(f"{n:>11,} {mode:>10} {speed:>11,.0f} {peak:>13,.0f} {start:>13,.0f} {steps:>6}")
    same = all(runs[n, "streaming"][0][0]["loss"] == runs[n, "in-memory"][0][0]["loss"] for n in args.sizes)
    print(f"same batches in both modes (identical losses): {same}")

    small, large = min(args.sizes), max(args.sizes)
    growth = table[large, "streaming"][1] / table[small, "streaming"][1]
    ratios = {n: table[n, "streaming"][0] / table[n, "in-memory"][0] for n in args.sizes}
    ok_rss, ok_speed = growth <= 1.2, all(r >= 0.9 for r in ratios.values())
    print(
        f"streaming peak RSS at {large:,} rows / at {small:,} rows: {growth:.3f} "
        f"(target <= 1.20: {'met' if ok_rss else 'NOT met'})"
    )
    for n, r in ratios.items():
        print(
            f"streaming / in-memory samples/s at {n:,} rows: {r:.3f} "
            f"(target >= 0.90: {'met' if r >= 0.9 else 'NOT met'})"
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0 if ok_rss and ok_speed and same else 1


if __name__ == "__main__":
    sys.exit(main())
