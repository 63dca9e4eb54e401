"""Data parallel DLRM training as a script, for torchrun on one machine or a cluster.

    torchrun --nproc-per-node 2 -m course_utils.scripts.train_ddp --out DIR
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
             --rdzv-id JOB -m course_utils.scripts.train_ddp --out DIR \\
             --kind torch --parquet clicks.parquet --steps 1000 --batch 65536

The same loop as the notebooks (``course_utils.ddp.ddp_worker``): torchrun sets
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; the script joins the
group (NCCL when every local rank has a GPU, else gloo; ``COURSE_BACKEND=gloo`` in the
environment forces gloo), trains, and each rank
writes ``DIR/rank<R>.json``: its final loss curve, a fingerprint of its
parameters (per-tensor sums, to compare runs without shipping the weights) and,
on rank 0, AUC and log loss on held-out rows. (With the c10d rendezvous, node ranks are
assigned when the nodes meet: no ``--node-rank``; ``--rdzv-id`` names the job, the same on
every node. ``scripts/ddp_canonical.py`` is the same kind of script in plain PyTorch.)

Data: ``--parquet FILE`` (each rank reads only its own row groups; their count
must be a multiple of the world size, see ``python -m course_utils.workload.data
repartition``), or synthetic click logs generated identically on every rank.

Taught in chapter 04 (section 9, the same training under ``torchrun``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from course_utils.scripts.rank_exit import run_without_interpreter_shutdown


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<R>.json")
    parser.add_argument("--kind", choices=("naive", "bucketed", "torch"), default="bucketed")
    parser.add_argument("--parquet", type=Path, help="training rows (default: synthetic, --rows of them)")
    parser.add_argument(
        "--rows", type=int, default=12_000, help="synthetic rows (the last 20%% are held out)"
    )
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps (0: one full epoch)")
    parser.add_argument("--batch", type=int, default=512, help="global batch: rows per step, all ranks")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def inputs(args: argparse.Namespace, rank: int = 0, world_size: int = 1):
    """``(training data, held-out logs or None, DLRMConfig, TrainSettings)`` for these arguments.

    Training data is the parquet path (each rank reads its own row groups later) or
    synthetic ``ClickLogs``, the same on every rank and in a notebook that calls this.
    """
    from course_utils.ddp import TrainSettings
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig

    if args.parquet is not None:
        # a row-group count that does not split evenly stops here, with the fix; ddp_worker reads the rows
        train, held_out, info = args.parquet, None, data.parquet_info(args.parquet)
        data.row_groups_of_rank(info["row_groups"], rank, world_size, args.parquet)
        cards = info["cardinalities"]
        if cards is None:
            raise SystemExit(
                f"{args.parquet} was not written by course_utils.workload.data.write_parquet "
                "(no cardinalities in its metadata)"
            )
    else:
        train, held_out = data.make_click_logs(args.rows, seed=args.seed).split(0.8)
        cards = train.cardinalities
    settings = TrainSettings(
        global_batch_size=args.batch,
        max_steps=args.steps or None,
        lr=args.lr,
        optimizer=args.optimizer,
        seed=args.seed,
    )
    return train, held_out, DLRMConfig(cards), settings


def fingerprint(state: dict) -> dict:
    """``{name: [sum, sum of |x|]}`` of every tensor, in float64: equal weights give equal numbers."""
    return {k: [float(v.double().sum()), float(v.double().abs().sum())] for k, v in state.items()}


def main(argv=None) -> None:
    args = parse(argv)
    import torch
    import torch.distributed as dist

    from course_utils.collectives import init_group
    from course_utils.ddp import ddp_worker
    from course_utils.runtime.hardware import pick_backend

    # NCCL if each local rank has a GPU; COURSE_BACKEND=gloo (stand-in nodes sharing GPUs) forces gloo
    backend = pick_backend(
        int(os.environ.get("LOCAL_WORLD_SIZE", "1")), os.environ.get("COURSE_BACKEND", "auto")
    )
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)  # ranks share this machine's cores
    init_group(backend)  # env:// : what torchrun set (NCCL: "cpu:gloo,cuda:nccl")
    try:
        train, held_out, model_config, settings = inputs(args, dist.get_rank(), dist.get_world_size())
        run = ddp_worker(args.kind, train, model_config, settings, eval_data=held_out)
        report = {
            "rank": run.rank,
            "world_size": run.world_size,
            "kind": run.kind,
            "step_loss": run.step_loss,
            "samples": run.samples,
            "auc": run.final.get("auc"),
            "logloss": run.final.get("logloss"),
        }
        report.update(backend=dist.get_backend(), fingerprint=fingerprint(run.state))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{report['rank']}.json").write_text(json.dumps(report))
        if report["rank"] == 0:
            print(
                f"{args.kind} DDP, {report['world_size']} ranks ({report['backend']}), "
                f"{len(report['step_loss'])} steps: last loss {report['step_loss'][-1]:.4f}"
            )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_without_interpreter_shutdown(main)  # why: rank_exit's docstring
