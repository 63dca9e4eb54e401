"""The production job: the hybrid DLRM under torchrun, checkpointed, resumable, preemptible.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        -m course_utils.scripts.train_hybrid --steps 40 --checkpoint-dir DIR --checkpoint-every 10

Every rank:

* builds chapter 07's hybrid DLRM: its share of the tables under a ``--sharding`` plan, the MLPs
  under DDP (``sharding.hybrid.HybridDLRM``);
* streams its own row groups of the ``--data`` parquet file (``ParquetBatches``), ``--batch-size``
  rows a step over all ranks (a global batch, so a resized job keeps its batch size); with no
  ``--data``, rank 0 first writes a seeded synthetic data set into ``DIR/data``;
* every ``--checkpoint-every`` steps starts an asynchronous DCP save into ``DIR/step_<N>``
  (``checkpoint.Checkpointer``): the sharded tables, the MLPs, Adam's state, the step, the data
  position and every rank's random state (``checkpoint.job``);
* at start-up resumes from the latest complete checkpoint, if any, written by this number of ranks
  or another: DCP reshards the tables; the data position is the step of the epoch, so a resized job
  continues the epoch (with the new layout's rows, not the old one's);
* on SIGTERM (what SLURM sends before a time limit or a preemption, and what torchrun passes on to
  its workers when it is itself told to stop), finishes its step; the ranks agree on the last step
  through the all-reduce that averages the loss (each adds its stop flag), write a final checkpoint,
  and exit. torchrun gives them ``--shutdown-timeout`` seconds (30 by default) before SIGKILL;
* appends what it does to ``DIR/events-rank<R>.jsonl`` (``job_events``).

Rank 0 prints ``step <N> loss <mean over ranks>`` every ``--log-every`` steps and, at the end,
``auc <value>`` (the test AUC over every rank's predictions, ``global_auc``) and then
``params sha256 <hex>`` (``sharding.gathered.state_sha256``: the same for equal states whatever
the number of ranks).

To show a failure, rank ``--kill-rank`` kills itself with SIGKILL just before step
``--kill-at-step``, on the first attempt only, once the checkpoints started before that step are
complete on disk (so where the job resumes from does not depend on timing); with
``--kill-what node`` it kills its torchrun agent first, as when a machine loses power.

Devices: NCCL with one GPU per rank where each local rank has one, gloo otherwise
(``COURSE_BACKEND=gloo`` forces gloo; ``COURSE_WIRE`` puts the modelled interconnect under it).

Taught in chapter 08.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from course_utils.scripts.job_events import attempt_number, log_event, torchrun_agent
from course_utils.scripts.rank_exit import run_without_interpreter_shutdown

SYNTHETIC_ROW_GROUPS = 24  # a multiple of 1, 2, 3, 4, 6, 8 and 12 ranks


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="train until this many steps in all")
    parser.add_argument("--batch-size", type=int, default=512, help="rows per step over ALL ranks")
    parser.add_argument("--sharding", choices=["table_wise", "row_wise", "column_wise"], default="row_wise")
    parser.add_argument("--data", type=Path, help="training parquet file (write_parquet); default: synthetic")
    parser.add_argument("--test-data", type=Path, help="test parquet file (needed with --data)")
    parser.add_argument("--synthetic-rows", type=int, default=65_536, help="training rows when no --data")
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="checkpoints, events, data")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10, help="steps between loss lines")
    parser.add_argument("--kill-rank", type=int, default=-1, help="rank that kills itself (-1: none)")
    parser.add_argument("--kill-at-step", type=int, default=-1, help="... just before this step")
    parser.add_argument(
        "--kill-what",
        choices=["rank", "node"],
        default="rank",
        help="node: the rank kills its torchrun agent first, as when a whole machine dies",
    )
    args = parser.parse_args(argv)
    if args.data is not None and args.test_data is None:
        parser.error("--data needs --test-data too (a parquet file of held-out rows)")
    for name in ("steps", "batch_size", "checkpoint_every", "synthetic_rows", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def synthetic_data(folder: Path, rows: int, seed: int) -> tuple[Path, Path]:
    """``(train, test)`` parquet files of the seeded synthetic click log in ``folder``, written by
    rank 0 if missing (each under a temporary name, then renamed: a killed write leaves no file),
    ``SYNTHETIC_ROW_GROUPS`` row groups each. The test set is the next ``rows // 4`` rows."""
    import torch.distributed as dist

    from course_utils.workload import data

    train, test = folder / "train.parquet", folder / "test.parquet"
    if dist.get_rank() == 0 and not (train.exists() and test.exists()):
        folder.mkdir(parents=True, exist_ok=True)
        logs = data.make_click_logs(rows + rows // 4, seed=seed)
        for path, part in ((train, logs[:rows]), (test, logs[rows:])):
            partial = path.with_suffix(".partial")
            data.write_parquet(part, partial, SYNTHETIC_ROW_GROUPS)
            partial.rename(path)
    dist.barrier()
    return train, test


class StopFlag:
    """Set by SIGTERM; the training loop reads it once a step. ``signal.signal`` needs the main thread."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True


def wait_until_complete(folder: Path, step: int, timeout: float = 60.0) -> None:
    """Block until the checkpoint of ``step`` (if one was started) has its ``.metadata``."""
    from course_utils.checkpoint import latest_complete

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = latest_complete(folder)
        if done is not None and int(done.name.split("_")[1]) >= step:
            return
        time.sleep(0.02)
    raise TimeoutError(f"the checkpoint of step {step} was not complete in {folder} after {timeout:g} s")


def train(args: argparse.Namespace) -> dict:
    """The job, in every rank (default process group up). Returns ``{"step", "auc", "sha256"}``."""
    import torch
    import torch.distributed as dist

    from course_utils.checkpoint import Checkpointer, job, latest_complete, random_state
    from course_utils.runtime.hardware import rank_device
    from course_utils.sharding.gathered import state_sha256
    from course_utils.sharding.hybrid import HybridDLRM, predict_own_rows
    from course_utils.workload import data
    from course_utils.workload.global_auc import distributed_auc
    from course_utils.workload.models import DLRMConfig
    from course_utils.workload.train import make_optimizer, train_step

    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise ValueError(
            f"--batch-size {args.batch_size} (rows per step over all ranks) cannot be split equally over "
            f"{world} ranks; use a multiple of {world}"
        )
    stop = StopFlag()
    out = args.checkpoint_dir
    attempt = attempt_number(out, rank)
    train_path, test_path = (
        (args.data, args.test_data)
        if args.data is not None
        else synthetic_data(out / "data", args.synthetic_rows, args.seed)
    )
    loader = data.ParquetBatches(train_path, args.batch_size // world, rank, world, seed=args.seed)
    test = data.read_parquet(test_path, rank, world)  # this rank's row groups of the test set
    random_state.seed_all(args.seed + rank)
    config = DLRMConfig(cardinalities=data.parquet_info(train_path)["cardinalities"])
    model = HybridDLRM(config, args.sharding, seed=args.seed)
    optimizer = make_optimizer(model, "adam", args.lr)
    checkpointer = Checkpointer(out, "async", group=dist.new_group(backend="gloo"), keep=2)

    # steps in all; the epoch, the layouts that worked on it before this one, and this one's batches
    step, epoch, history, done = 0, 0, [], 0
    resume_from = latest_complete(out)
    if resume_from is not None:
        progress = job.load_job(model, optimizer, resume_from, seed=args.seed)
        step, epoch, history = progress["step"], progress["epoch"], progress["history"]
    this_layout = (world, args.batch_size // world)
    log_event(
        out,
        attempt=attempt,
        rank=rank,
        event="resumed" if resume_from else "started",
        step=step,
        world_size=world,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        node=os.environ.get("GROUP_RANK"),
    )

    def save() -> None:
        position = history + [(*this_layout, done)] if done else history
        state = job.job_state(model, optimizer, {"step": step, "epoch": epoch}, position)
        checkpointer.save(state, step)
        if rank == 0:
            log_event(out, attempt=attempt, rank=rank, event="checkpoint", step=step)

    device, stopped, last_saved = rank_device(), False, None  # last_saved: this attempt's latest save
    while step < args.steps and not stopped:
        loader.set_epoch(epoch, history)
        if len(loader) == 0:  # nothing left of this epoch for this layout: the next one
            epoch, history, done = epoch + 1, [], 0
            continue
        for batch in loader:
            if attempt == 0 and rank == args.kill_rank and step + 1 == args.kill_at_step:
                if last_saved is not None:
                    wait_until_complete(out, last_saved)
                log_event(out, attempt=attempt, rank=rank, event="killed", step=step + 1, what=args.kill_what)
                if args.kill_what == "node":
                    os.kill(torchrun_agent(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            loss = train_step(model, optimizer, batch)
            step, done = step + 1, done + 1
            # one all-reduce: the loss summed, and how many ranks were asked to stop
            both = torch.tensor([loss, float(stop.requested)], device=device)
            dist.all_reduce(both)
            mean_loss, stopped = both[0].item() / world, both[1].item() > 0
            log_event(out, attempt=attempt, rank=rank, event="step", step=step, loss=mean_loss)
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step} loss {mean_loss:.4f}", flush=True)
            if step % args.checkpoint_every == 0 or stopped or step == args.steps:
                save()
                last_saved = step
            if stopped or step == args.steps:
                break
        else:  # the epoch ran out
            epoch, history, done = epoch + 1, [], 0
    checkpointer.close()  # the last save is complete on disk before anyone reports or exits
    if stopped:
        log_event(out, attempt=attempt, rank=rank, event="stopped", step=step)
        if rank == 0:
            print(f"stopped by SIGTERM after step {step}; checkpoint {out.name}/step_{step:06d}", flush=True)
        return {"step": step, "auc": None, "sha256": None}
    test_auc = distributed_auc(test.label, predict_own_rows(model, test))
    digest = state_sha256(model)
    log_event(out, attempt=attempt, rank=rank, event="finished", step=step, auc=test_auc, sha256=digest)
    if rank == 0:
        print(f"auc {test_auc:.6f}", flush=True)
        print(f"params sha256 {digest}", flush=True)
    return {"step": step, "auc": test_auc, "sha256": digest}


def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: rank, world size and meeting place come from the environment."""
    args = parse(argv)
    import torch.distributed as dist

    from course_utils.runtime import wire
    from course_utils.runtime.hardware import group_backend, torchrun_rank_backend

    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(wire.backend_from_env(group_backend(torchrun_rank_backend())))
    try:
        train(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_without_interpreter_shutdown(main)
