"""Data-parallel DLRM training that survives a killed rank: run it under torchrun.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        -m course_utils.scripts.elastic_train --out DIR --kill-rank 1 --kill-at-step 14

Every ``--checkpoint-every`` steps rank 0 saves the weights, the optimizer state and
the data position (``course_utils.checkpoint``). At start-up every rank loads the
latest checkpoint, if there is one, and carries on from there. To show a failure,
rank ``--kill-rank`` kills itself with SIGKILL just before step ``--kill-at-step``,
on the first attempt only; torchrun then stops the other ranks and starts them all
again (``--max-restarts``). With ``--kill-what node`` it first kills its torchrun agent:
the whole node is gone, and no restart inside the job can bring it back (under SLURM the
job ends and is requeued, appendix 08c, section 2). A rank counts its attempts in its own event log:
torchrun's ``TORCHELASTIC_RESTART_COUNT`` counts the failures *one node's* agent saw, so
on several nodes a node whose ranks did not fail may still say 0 after a restart. Each rank
appends what it does to
``DIR/events-rank<R>.jsonl``; rank 0 writes the final weights to ``DIR/final.pt``.

Taught in chapter 08 (sections 1 and 2, what a checkpoint must hold; kill, resume, compare).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from course_utils.scripts.job_events import attempt_number, log_event, torchrun_agent
from course_utils.scripts.rank_exit import run_without_interpreter_shutdown


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for checkpoint, events and final weights"
    )
    parser.add_argument("--rows", type=int, default=2048, help="synthetic click-log rows to train on")
    parser.add_argument("--batch-size", type=int, default=128, help="rows per rank per step")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--kill-rank", type=int, default=-1, help="rank that kills itself (-1: none)")
    parser.add_argument(
        "--kill-at-step", type=int, default=-1, help="... just before this step, first attempt only"
    )
    parser.add_argument(
        "--kill-what",
        choices=["rank", "node"],
        default="rank",
        help="rank: the rank kills itself (torchrun restarts the ranks); node: it kills its "
        "torchrun agent first, as when a whole machine dies (under torchrun only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--forget",
        choices=["nothing", "optimizer", "data-position"],
        default="nothing",
        help="a deliberately incomplete resume, to see what each part of a checkpoint is for",
    )
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> dict:
    """The training loop; needs the default process group. Returns the final weights."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    from course_utils import checkpoint
    from course_utils.ddp.bucketed import settle_ddp_buckets
    from course_utils.runtime.hardware import rank_device
    from course_utils.workload import data
    from course_utils.workload.data import Batch
    from course_utils.workload.models import DLRM
    from course_utils.workload.train import make_optimizer, train_step

    rank = dist.get_rank()
    device = rank_device()
    attempt = attempt_number(args.out, rank)
    logs = data.make_click_logs(args.rows, seed=args.seed, cardinalities=data.criteo_cardinalities(1 / 1000))
    dataset = TensorDataset(*(torch.from_numpy(a) for a in (logs.dense, logs.sparse, logs.label)))
    sampler = checkpoint.ResumableSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DDP(
        DLRM(logs.cardinalities, seed=args.seed).to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
    )
    settle_ddp_buckets(
        model,
        torch.zeros(1, logs.n_dense, device=device),
        torch.zeros(1, logs.n_sparse, dtype=torch.long, device=device),
    )
    optimizer = make_optimizer(model, "adam", args.lr)
    path = args.out / "checkpoint.pt"
    state = checkpoint.load_on_every_rank(path, map_location=device)
    step = checkpoint.restore_training_state(state, model, optimizer, sampler) if state else 0
    if state and args.forget == "optimizer":  # Adam starts again: moments zero, step count 0
        optimizer = make_optimizer(model, "adam", args.lr)
    elif state and args.forget == "data-position":  # the epoch restarts from its first batch
        sampler.consumed = 0
    log_event(
        args.out,
        attempt=attempt,
        rank=rank,
        event="resumed" if state else "started",
        step=step,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        node=os.environ.get("GROUP_RANK"),
    )
    for epoch in range(sampler.epoch if state else 0, args.epochs):
        sampler.set_epoch(epoch)
        for dense, sparse, label in loader:
            if attempt == 0 and rank == args.kill_rank and step + 1 == args.kill_at_step:
                log_event(
                    args.out, attempt=attempt, rank=rank, event="killed", step=step + 1, what=args.kill_what
                )
                if args.kill_what == "node":
                    os.kill(torchrun_agent(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            loss = train_step(model, optimizer, Batch(dense.to(device), sparse.to(device), label.to(device)))
            sampler.advance(len(label))
            step += 1
            log_event(args.out, attempt=attempt, rank=rank, event="step", step=step, loss=loss)
            if step % args.checkpoint_every == 0:
                checkpoint.save_on_rank0(checkpoint.training_state(model, optimizer, sampler, step), path)
                if rank == 0:
                    log_event(args.out, attempt=attempt, rank=rank, event="checkpoint", step=step)
    final = {k: v.detach().cpu().clone() for k, v in model.module.state_dict().items()}
    if rank == 0:
        torch.save(final, args.out / "final.pt")
    log_event(args.out, attempt=attempt, rank=rank, event="finished", step=step)
    return final


def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: rank, world size and meeting place come from the environment."""
    args = parse(argv)
    import torch.distributed as dist

    from course_utils.runtime.hardware import group_backend, torchrun_rank_backend

    args.out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(group_backend(torchrun_rank_backend()))  # nccl: "cpu:gloo,cuda:nccl"
    try:
        train(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: torchrun's summary names a rank's error; run_without_...: why in rank_exit's docstring
    run_without_interpreter_shutdown(record(main))
