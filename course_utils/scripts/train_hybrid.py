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
  position and every rank's random state, all as tensors (``checkpoint.job``);
* with ``--checkpoint-url URL`` (``s3://bucket/job``), writes, lists, prunes and resumes those
  checkpoints at ``URL/step_<N>`` instead, through DCP's fsspec storage (``checkpoint.folders``:
  ``UPath``); ``DIR`` keeps the events, attempts and synthetic data; a URL fsspec cannot reach
  (unknown scheme, missing bucket) is bad input;
* trains the tables with Adam, as the MLPs (the default), or with ``--table-optimizer adagrad``
  (``sharding.table_optimizer``), under which a row no id looked up does not change;
* at start-up resumes from the newest complete checkpoint (ordered by step), if any, written by
  this number of ranks or another, and rank 0 says where it resumed from: DCP reshards the tables;
  the data position is the step of the epoch, so a resized job continues the epoch (with the new
  layout's rows, not the old one's). An incomplete checkpoint (its save was interrupted) is
  skipped, said so, and deleted once a newer one is complete. A folder holding pickled values is
  refused (loading it could run code: ``checkpoint.safe_load``);
* on SIGTERM (what SLURM sends before a time limit or a preemption, and what torchrun passes on to
  its workers when it is itself told to stop), on SIGINT (Ctrl-C: torchrun passes that on too) and
  when its torchrun agent is gone (killed with SIGKILL), finishes its step; the ranks agree on the
  last step through the all-reduce that averages the loss (each adds its stop flag), write a final
  checkpoint, and exit. torchrun gives them 30 s before SIGKILL (torch >= 2.12:
  ``--shutdown-timeout``);
* appends what it does to ``DIR/events-rank<R>.jsonl`` (``job_events``): a checkpoint when its
  save begins (``saving``) and when it is complete (``checkpoint``).

Bad input (arguments, no torchrun, data, checkpoint folder) is found before any rank trains and
said in one line, once, with exit code 2 (``job_checks``); ``main`` runs under torch's ``@record``,
so that torchrun's summary names the error.

Rank 0 prints ``step <N> loss <mean over ranks>`` every ``--log-every`` steps and, at the end,
``auc <value>`` (the test AUC over every rank's predictions, ``global_auc``) and then
``params sha256 <hex>`` (``sharding.gathered.state_sha256``: the same for equal states whatever
the number of ranks).

To show a failure, rank ``--kill-rank`` kills itself with SIGKILL just before step
``--kill-at-step``, on the first attempt only, once the checkpoints started before that step are
complete on disk (so where the job resumes from does not depend on timing); with
``--kill-what node`` it kills its torchrun agent first, as when a machine loses power; with
``--kill-what rendezvous-host``, every rank whose agent hosts the c10d rendezvous store does so
(whatever ``--kill-rank``), as when the first node of a job is lost. The loop asks a
``faults.FaultInjector`` once a step; without ``--kill-*`` it does nothing.

Devices: NCCL with one GPU per rank where each local rank has one, gloo otherwise
(``COURSE_BACKEND=gloo`` forces gloo; ``COURSE_CLUSTER=h100:nvlink`` runs the ranks on that modeled
cluster instead, in its virtual time: ``course_utils.runtime.cluster``).

Taught in chapter 08.
"""

from __future__ import annotations

import os
from pathlib import Path

from course_utils.scripts import job_checks
from course_utils.scripts.faults import FaultInjector
from course_utils.scripts.job_control import StopFlag, where_to_resume
from course_utils.scripts.job_events import attempt_number, log_event
from course_utils.scripts.rank_exit import run_without_interpreter_shutdown

SYNTHETIC_ROW_GROUPS = 24  # a multiple of 1, 2, 3, 4, 6, 8 and 12 ranks


def parse(argv: list[str] | None = None):
    """The job's arguments; a bad one raises ``job_checks.JobInputError`` (one line)."""
    parser = job_checks.OneLineParser(prog="train_hybrid", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="train until this many steps in all")
    parser.add_argument("--batch-size", type=int, default=512, help="rows per step over ALL ranks")
    parser.add_argument("--sharding", choices=["table_wise", "row_wise", "column_wise"], default="row_wise")
    parser.add_argument(
        "--data",
        type=Path,
        help="training parquet file (write_parquet; a Criteo TSV: convert it with "
        "python -m course_utils.workload.data from-criteo); default: synthetic",
    )
    parser.add_argument("--test-data", type=Path, help="test parquet file (needed with --data)")
    parser.add_argument("--synthetic-rows", type=int, default=65_536, help="training rows when no --data")
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="checkpoints, events, data")
    parser.add_argument("--checkpoint-url", help="checkpoints in object storage (s3://bucket/job) instead")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate")
    parser.add_argument("--table-optimizer", choices=["adam", "adagrad"], default="adam", help="the tables'")
    parser.add_argument("--table-lr", type=float, help="the tables' Adagrad learning rate (default: --lr)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10, help="steps between loss lines")
    parser.add_argument("--kill-rank", type=int, default=-1, help="rank that kills itself (-1: none)")
    parser.add_argument("--kill-at-step", type=int, default=-1, help="... just before this step")
    parser.add_argument(
        "--kill-what",
        choices=["rank", "node", "rendezvous-host"],
        default="rank",
        help="node: the rank kills its torchrun agent first, as when a whole machine dies; "
        "rendezvous-host: the ranks whose agent hosts the c10d rendezvous store do",
    )
    args = parser.parse_args(argv)
    args.checkpoints = args.checkpoint_url or args.checkpoint_dir  # where the step_<N> checkpoints are
    if args.data is not None and args.test_data is None:
        parser.error("--data needs --test-data too (a parquet file of held-out rows)")
    for name in ("steps", "batch_size", "checkpoint_every", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.synthetic_rows < 4 * SYNTHETIC_ROW_GROUPS:  # the test set is a quarter, in as many row groups
        parser.error(
            f"--synthetic-rows must be at least {4 * SYNTHETIC_ROW_GROUPS}, got {args.synthetic_rows}"
        )
    for name in ("lr", "table_lr"):
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            parser.error(
                f"--{name.replace('_', '-')} must be a positive learning rate, got {getattr(args, name)}"
            )
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


def _data(args, out: Path, rank: int, world: int):
    """``(config, loader, test)``: the DLRM's config for the training data, this rank's batches of
    it (``ParquetBatches``) and its row groups of the test set; the synthetic data set is written
    first when there is no ``--data``."""
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig

    train_path, test_path = (
        (args.data, args.test_data)
        if args.data is not None
        else synthetic_data(out / "data", args.synthetic_rows, args.seed)
    )
    config = DLRMConfig(cardinalities=data.parquet_info(train_path)["cardinalities"])
    if args.data is None:  # the data exists now: the checkpoints must be of this job
        job_checks.check_checkpoint_matches(args.checkpoints, config.cardinalities, config.embedding_dim)
    loader = data.ParquetBatches(train_path, args.batch_size // world, rank, world, seed=args.seed)
    return config, loader, data.read_parquet(test_path, rank, world)


def _resume(args, model, optimizer, attempt: int) -> tuple[int, int, list]:
    """``(step, epoch, history)`` to start from: those of the newest complete checkpoint, loaded
    into ``model`` and ``optimizer``, or a fresh start; logged (``started`` or ``resumed``)."""
    import torch.distributed as dist

    from course_utils.checkpoint import job

    out, rank, world = args.checkpoint_dir, dist.get_rank(), dist.get_world_size()
    step, epoch, history = 0, 0, []
    resume_from = where_to_resume(args.checkpoints, rank)
    if resume_from is not None:
        progress = job.load_job(model, optimizer, resume_from, seed=args.seed)
        step, epoch, history = progress["step"], progress["epoch"], progress["history"]
        if rank == 0:
            print(f"resumed at step {step} from {resume_from}", flush=True)
    log_event(
        out,
        attempt=attempt,
        rank=rank,
        event="resumed" if resume_from else "started",
        step=step,
        world_size=world,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        node=os.environ.get("GROUP_RANK"),
        folder=resume_from.name if resume_from else None,
    )
    return step, epoch, history


def train(args, stop: StopFlag) -> dict:
    """The job, in every rank (default process group up). Returns ``{"step", "auc", "sha256"}``."""
    import torch
    import torch.distributed as dist

    from course_utils.checkpoint import Checkpointer, job, random_state
    from course_utils.runtime.hardware import rank_device
    from course_utils.sharding.hybrid import HybridDLRM
    from course_utils.sharding.table_optimizer import hybrid_optimizer
    from course_utils.workload.train import train_step

    rank, world = dist.get_rank(), dist.get_world_size()
    out = args.checkpoint_dir
    attempt = attempt_number(out, rank)
    config, loader, test = _data(args, out, rank, world)
    random_state.seed_all(args.seed + rank)
    model = HybridDLRM(config, args.sharding, seed=args.seed)
    optimizer = hybrid_optimizer(model, args.table_optimizer, args.lr, args.table_lr)
    checkpointer = Checkpointer(args.checkpoints, "async", group=dist.new_group(backend="gloo"), keep=2)

    # steps in all; the epoch, the layouts that worked on it before this one, and this one's batches
    step, epoch, history = _resume(args, model, optimizer, attempt)
    this_layout, done = (world, args.batch_size // world), 0
    faults = FaultInjector(args, out, rank, attempt, first_step=step)

    def complete(saved_step: int) -> None:  # in DCP's writing thread, once the save is on disk
        log_event(out, attempt=attempt, rank=rank, event="checkpoint", step=saved_step)

    def save() -> None:
        position = history + [(*this_layout, done)] if done else history
        state = job.job_state(model, optimizer, {"step": step, "epoch": epoch}, position)
        if rank == 0:
            log_event(out, attempt=attempt, rank=rank, event="saving", step=step)
        checkpointer.save(state, step, on_complete=complete if rank == 0 else None)

    device, stopped = rank_device(), False
    while step < args.steps and not stopped:
        loader.set_epoch(epoch, history)
        if len(loader) == 0:  # nothing left of this epoch for this layout: the next one
            epoch, history, done = epoch + 1, [], 0
            continue
        for batch in loader:
            faults.before_step(step + 1)  # the demonstration kills (--kill-*); nothing otherwise
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
            if stopped or step == args.steps:
                break
        else:  # the epoch ran out
            epoch, history, done = epoch + 1, [], 0
    checkpointer.close()  # the last save is complete on disk before anyone reports or exits
    return _report(out, attempt, step, model, test, stop if stopped else None, args.checkpoint_url)


def _report(out: Path, attempt: int, step: int, model, test, stop: StopFlag | None, url=None) -> dict:
    """The job's end, logged and said by rank 0: stopped (``stop``: what asked, then no AUC), or
    finished with its test AUC and parameters' hash. Returns ``{"step", "auc", "sha256"}``."""
    import torch.distributed as dist

    from course_utils.sharding.gathered import state_sha256
    from course_utils.sharding.hybrid import predict_own_rows
    from course_utils.workload.global_auc import distributed_auc

    rank = dist.get_rank()
    if stop is not None:
        log_event(out, attempt=attempt, rank=rank, event="stopped", step=step, why=stop.why)
        if rank == 0:
            why = stop.why or "another rank's stop request"
            where = url.rstrip("/") if url else out.name
            print(f"stopped by {why} after step {step}; checkpoint {where}/step_{step:06d}", flush=True)
        return {"step": step, "auc": None, "sha256": None}
    test_auc = distributed_auc(test.label, predict_own_rows(model, test))
    digest = state_sha256(model)
    log_event(out, attempt=attempt, rank=rank, event="finished", step=step, auc=test_auc, sha256=digest)
    if rank == 0:
        print(f"auc {test_auc:.6f}", flush=True)
        print(f"params sha256 {digest}", flush=True)
    return {"step": step, "auc": test_auc, "sha256": digest}


def check_inputs(args) -> None:
    """Everything that can be checked before the process group starts (``job_checks``)."""
    from course_utils.scripts import job_optimizer
    from course_utils.workload.models import DLRMConfig

    world = job_checks.world_size_from_launcher()
    job_checks.check_cluster_env()
    job_checks.check_batch(args, world)
    job_checks.check_checkpoint_dir(args.checkpoint_dir)
    job_checks.check_checkpoint_url(args.checkpoint_url)
    job_optimizer.check_checkpoint_optimizer(args.checkpoints, args.table_optimizer)
    given = job_checks.check_data(args, world)
    if given is not None:
        train_info, _ = given
        dim = DLRMConfig(train_info["cardinalities"]).embedding_dim
        job_checks.check_checkpoint_matches(args.checkpoints, train_info["cardinalities"], dim)


def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: rank, world size and meeting place come from the environment.
    Bad input: one line from rank 0, exit code 2 on every rank (``job_checks``)."""
    stop = StopFlag()  # first: a Ctrl-C or SIGTERM during start-up is a stop request too
    rank = int(os.environ.get("RANK", "0"))
    try:
        args = parse(argv)
        check_inputs(args)
    except job_checks.JobInputError as error:
        job_checks.report_and_exit(error, rank, stop)
    import torch.distributed as dist

    from course_utils.runtime import cluster
    from course_utils.runtime.hardware import group_backend, torchrun_rank_backend

    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(cluster.backend_from_env(group_backend(torchrun_rank_backend())))
    try:
        train(args, stop)
    except job_checks.JobInputError as error:  # found once the data was there: every rank finds it
        job_checks.report_and_exit(error, rank, stop)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    run_without_interpreter_shutdown(record(main))  # record: torchrun's summary names the error
