"""PyTorch's canonical DDP script, plain: what a training script for torchrun looks like.

    torchrun --nproc-per-node 2 --standalone -m course_utils.scripts.ddp_canonical --out DIR

Nothing of the course's own DDP: one process per device, ``torch.cuda.set_device(local_rank)``
and ``DDP(model, device_ids=[local_rank])`` where each process has a GPU (on CPUs: gloo, no
``device_ids``), a ``DataLoader`` whose ``DistributedSampler`` gives each rank its rows, with
``sampler.set_epoch(epoch)`` before every epoch, the checkpoint written by rank 0 only, and
``destroy_process_group()`` at the end. The data are the course's synthetic click logs, the
model its DLRM.

Evaluation shows the sampler's padding. ``DistributedSampler(drop_last=False)`` (the
default) repeats the first indices until every rank has ``ceil(n / w)`` rows, so a metric
summed over what the ranks read counts those rows twice; ``drop_last=True`` instead leaves
the last rows out. The exact metric splits the rows without padding (rank ``r`` takes
``r, r + w, ...``: uneven counts are fine when no gradient is exchanged) and all-reduces
the sum of losses and the count. Each rank writes ``DIR/rank<R>.json``; rank 0 also writes
``DIR/model.pt`` and checks the held-out log loss of one process on all rows.

The chapter runs it through ``ddp_canonical_os_exit``, which calls this ``main`` and then ends the
process without Python's shutdown: on CPUs (gloo) a finished rank can abort while the
interpreter exits (pytorch/pytorch#190489; chapter 04's footnote to section 8).

Taught in chapter 04 (section 8, PyTorch's canonical DDP script).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from course_utils.workload.models import DLRMConfig


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<R>.json and model.pt")
    parser.add_argument("--rows", type=int, default=4_000, help="synthetic training rows")
    parser.add_argument("--eval-rows", type=int, default=101, help="held-out rows (not a multiple of w)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256, help="rows per rank per step")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def datasets(args: argparse.Namespace) -> tuple[TensorDataset, TensorDataset, list[int]]:
    """(training rows, held-out rows, cardinalities): ``TensorDataset(dense, sparse, label)``s,
    the same on every rank (same seed)."""
    from course_utils.workload import data

    logs = data.make_click_logs(args.rows + args.eval_rows, seed=args.seed)
    train, held_out = logs[: args.rows], logs[args.rows :]
    return TensorDataset(*train.to_torch()), TensorDataset(*held_out.to_torch()), list(logs.cardinalities)


@torch.no_grad()
def summed_loss(model: nn.Module, rows, device: torch.device) -> torch.Tensor:
    """``[sum of per-row log losses, row count]`` (float64) over ``rows``, all-reduced over the ranks."""
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for dense, sparse, label in DataLoader(rows, batch_size=1024):
        logits = model(dense.to(device), sparse.to(device))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, label.to(device), reduction="sum")
        total += torch.stack([loss.double(), torch.tensor(len(label), dtype=torch.float64, device=device)])
    dist.all_reduce(total)
    return total


def main(argv=None) -> None:
    args = parse(argv)
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.device_count() >= local_world:  # one GPU per process on this machine
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)  # the ranks share this machine's cores
    dist.init_process_group(backend)  # env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        train, held_out, cardinalities = datasets(args)
        model = DLRMConfig(cardinalities).build(seed=args.seed).to(device)
        ddp = DDP(model, device_ids=[local_rank]) if device.type == "cuda" else DDP(model)
        optimizer = torch.optim.Adagrad(ddp.parameters(), lr=args.lr)
        sampler = DistributedSampler(train, shuffle=True, seed=args.seed)  # this rank's rows
        loader = DataLoader(train, batch_size=args.batch, sampler=sampler)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            for dense, sparse, label in loader:
                optimizer.zero_grad()
                logits = ddp(dense.to(device), sparse.to(device))
                nn.functional.binary_cross_entropy_with_logits(logits, label.to(device)).backward()
                optimizer.step()
        report = evaluation_report(ddp.module, held_out, device, rank, world)  # held-out log loss, 3 ways
        # details: add this rank's row and step counts, write DIR/rank<R>.json
        report.update(backend=backend, rows_read=len(sampler), steps=args.epochs * len(loader))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{rank}.json").write_text(json.dumps(report))
        # end details
        if rank == 0:  # the checkpoint: one copy, written by rank 0 only
            torch.save(ddp.module.state_dict(), args.out / "model.pt")
            print(f"{world} ranks ({backend}): {report['steps']} steps; rank 0 saved model.pt")
    finally:
        dist.destroy_process_group()


def evaluation_report(model: nn.Module, held_out: TensorDataset, device, rank: int, world: int) -> dict:
    """Held-out log loss summed over what the ranks read, three ways; rank 0 adds one process's.

    ``padded``: ``DistributedSampler`` (drop_last=False) rows, some counted twice;
    ``drop_last``: its ``drop_last=True`` rows, some never counted; ``exact``: a split
    without padding. ``rows_counted`` says how many rows each way added up.
    """
    model.eval()  # the plain module: evaluation needs no gradient all-reduce
    ways = {
        "padded": list(DistributedSampler(held_out, shuffle=False)),
        "drop_last": list(DistributedSampler(held_out, shuffle=False, drop_last=True)),
        "exact": range(rank, len(held_out), world),
    }
    sums = {way: summed_loss(model, Subset(held_out, list(rows)), device) for way, rows in ways.items()}
    report = {
        "rank": rank,
        "world_size": world,
        "eval_rows": len(held_out),
        "logloss": {way: float(t[0] / t[1]) for way, t in sums.items()},
        "rows_counted": {way: int(t[1]) for way, t in sums.items()},
    }
    if rank == 0:
        report["logloss"]["one process"] = summed_loss_local(model, held_out, device)
    return report


@torch.no_grad()
def summed_loss_local(model: nn.Module, rows: TensorDataset, device: torch.device) -> float:
    """Mean log loss of ``model`` over all ``rows``, in this process alone."""
    dense, sparse, label = (t.to(device) for t in rows.tensors)
    return float(nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), label).double())


if __name__ == "__main__":
    main()
