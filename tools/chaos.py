"""Interrupt the production job at random moments, checkpoint writes included; check that nothing is lost.

    python tools/chaos.py --interruptions 30 --seed 0                 # by hand: 10 runs of 3
    python tools/chaos.py --interruptions 4 --per-run 2 --kinds all    # the short version (a test)

First the job runs once uninterrupted, for its final parameter hash. Then each run starts the same
``torchrun ... -m course_utils.scripts.train_hybrid`` from an empty checkpoint folder and interrupts it
``--per-run`` times, each time with one of:

* ``kill-rank``: SIGKILL to one rank (torchrun, under ``--max-restarts``, restarts them all);
* ``sigint`` / ``sigterm``: the signal to torchrun, which passes it on; then the same command again;
* ``kill-torchrun``: SIGKILL to torchrun itself (its ranks notice that their agent is gone); once its
  ranks have ended, the same command again;

at a random moment: for half the interruptions (in a random order) as soon as a checkpoint save has
begun (rank 0's ``saving`` event), for the others after a random step. Each kind is used as often as
the others, in a random order. Whether an interruption fell during a checkpoint write is read from the
evidence at the moment of the signal: the save had begun (its event) and its folder had no
``.metadata`` yet. A run **loses** something when its final hash differs from the uninterrupted
job's, or when, after an interruption, it resumes from an earlier step than the newest checkpoint
that was complete at the signal or that the stop handler wrote after it. After each torchrun ends
(and its orphans, for ``kill-torchrun``, within ``--orphan-wait`` s), no process of the run may be
left (found by a mark in their environment), and no new file in ``/dev/shm``.

Prints one line per interruption, then the counts by kind and moment, and the losses and leftovers.
Exit code 0 when nothing was lost or left, and at least ``--min-during-write`` interruptions fell
during a write; 1 otherwise.

Not taught in a chapter: a maintainers' tool (CONTRIBUTING.md); its short version runs in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.runtime import loopback, process_tree  # noqa: E402
from course_utils.scripts.job_events import read_log  # noqa: E402

KINDS = ("kill-rank", "sigint", "sigterm", "kill-torchrun")
RESTARTING = {"kill-rank"}  # torchrun restarts the ranks itself; the others need the command again


@dataclass
class Interruption:
    run: int
    kind: str
    sent_at: float
    step: int  # rank 0's last step when the signal was sent
    during_write: bool
    newest_complete: int  # the newest checkpoint complete at the signal (0: none)
    stop_checkpoint: int | None = None  # written by the stop handler after the signal
    resumed_from: int | None = None  # where the next attempt started
    lost: bool = False


def job_command(folder: Path, steps: int, every: int) -> list[str]:
    return [
        *(sys.executable, "-m", "torch.distributed.run"),
        *("--standalone", "--nproc-per-node", "2", "--max-restarts", "3"),
        *("-m", "course_utils.scripts.train_hybrid", "--steps", str(steps)),
        *("--checkpoint-every", str(every), "--log-every", str(steps), "--checkpoint-dir", str(folder)),
    ]


def start(command: list[str], mark: dict, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # restarts: elastic_run.SHARED_STORE_FIX
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **loopback.loopback_environment(),
        **mark,
    }
    with open(log, "a") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def events(folder: Path) -> list[dict]:
    """Rank 0's events (its log is complete: rank 0 logs steps, saves and stops)."""
    return read_log(folder, 0)


def complete_steps(folder: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in folder.glob("step_*") if (p / ".metadata").exists())


def wait_for_moment(
    proc, folder: Path, after: float, aim_save: bool, left: int, rng: random.Random, steps: int
) -> bool:
    """Wait for the moment of the next interruption: once an attempt has started after time
    ``after``, its next save beginning (``aim_save``) or a random step of it, early enough to leave
    room for the ``left - 1`` interruptions after it. False if the job ended first."""
    target, began = None, None
    while proc.poll() is None:
        log = events(folder)
        if began is None:
            began = next(
                (e["time"] for e in log if e["event"] in ("started", "resumed") and e["time"] > after), None
            )
        if began is not None:
            new = [e for e in log if e["time"] >= began]
            done = [e["step"] for e in new if e["event"] == "step"]
            if aim_save and any(e["event"] == "saving" for e in new):
                return True
            if not aim_save and done:
                target = target or rng.randint(done[0], done[0] + max(0, steps - 2 - done[0]) // left)
                if max(done) >= target:
                    return True
        time.sleep(0.005)
    return False


def evidence(folder: Path, sent_at: float) -> tuple[int, bool, int]:
    """At the signal: rank 0's last step, whether a save had begun and was not complete (no
    ``checkpoint`` event, no ``.metadata``), and the newest complete checkpoint."""
    log = [e for e in events(folder) if e["time"] <= sent_at]
    steps = [e["step"] for e in log if e["event"] == "step"]
    begun = [e["step"] for e in log if e["event"] == "saving"]
    finished = {e["step"] for e in log if e["event"] == "checkpoint"}
    complete = complete_steps(folder)
    writing = bool(begun) and begun[-1] not in finished and begun[-1] not in complete
    return (steps[-1] if steps else 0), writing, max(complete, default=0)


def interrupt(proc, kind: str, rng: random.Random) -> None:
    if kind == "kill-rank":
        parents = process_tree.parents()
        workers = sorted(p for p in process_tree.descendants(proc.pid) if parents.get(p) == proc.pid)
        process_tree.signal_all([rng.choice(workers)], signal.SIGKILL)
    else:
        sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "kill-torchrun": signal.SIGKILL}[kind]
        proc.send_signal(sig)


def leftovers(mark: dict, wait: float) -> list[int]:
    """Processes of the run still alive after ``wait`` seconds (then SIGKILLed: the next run starts clean)."""
    deadline = time.monotonic() + wait
    alive = []
    while time.monotonic() < deadline:
        alive = [p for p in process_tree.marked(mark) if process_tree.alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    process_tree.signal_all(alive, signal.SIGKILL)
    return alive


def shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def one_run(
    number: int,
    folder: Path,
    command: list[str],
    kinds: list[str],
    aims: list[bool],
    rng,
    steps: int,
    orphan_wait: float,
    log: Path,
) -> tuple[list[Interruption], str, list[int]]:
    """Run the job to its end through the interruptions ``kinds``, in order, each at a save
    beginning or a random step (``aims``). Returns the interruptions, the final hash and the pids
    left behind."""
    mark, done, left, starts = process_tree.new_mark(), [], [], 1
    proc, since = start(command, mark, log), 0.0
    while True:
        left_ = len(kinds) - len(done)
        if left_ and wait_for_moment(proc, folder, since, aims[len(done)], left_, rng, steps):
            kind, sent_at = kinds[len(done)], time.time()
            step, writing, newest = evidence(folder, sent_at)
            interrupt(proc, kind, rng)
            done.append(Interruption(number, kind, sent_at, step, writing, newest))
            since = sent_at
            if kind in RESTARTING:  # torchrun starts the ranks again itself
                continue
        proc.wait()  # stopped by the interruption, or finished
        left += leftovers(mark, orphan_wait)
        if any(e["event"] == "finished" for e in events(folder)):
            break
        starts += 1
        if starts > len(kinds) + 2:  # more starts than interruptions: the job fails by itself
            raise RuntimeError(
                f"run {number}: the job keeps failing by itself (exit {proc.returncode}); see {log}"
            )
        proc = start(command, mark, log)  # the same command again
    judge(done, events(folder))
    return done, [e for e in events(folder) if e["event"] == "finished"][-1]["sha256"], left


def judge(done: list[Interruption], log: list[dict]) -> None:
    """Each interruption's stop checkpoint, where the next attempt started, and whether it lost:
    it did if it started before the newest checkpoint complete at the signal or written since."""
    for item in done:
        starts = [e for e in log if e["event"] in ("started", "resumed") and e["time"] > item.sent_at]
        until = starts[0]["time"] if starts else float("inf")
        stops = [e["step"] for e in log if e["event"] == "stopped" and item.sent_at < e["time"] < until]
        item.stop_checkpoint = stops[0] if stops else None
        item.resumed_from = starts[0]["step"] if starts else None
        expected = max(item.newest_complete, item.stop_checkpoint or 0)
        item.lost = item.resumed_from is not None and item.resumed_from < expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interruptions", type=int, default=30)
    parser.add_argument("--per-run", type=int, default=3, help="interruptions in each run of the job")
    parser.add_argument("--kinds", default="all", help=f"comma-separated, of {', '.join(KINDS)} (or all)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-during-write", type=int, default=0)
    parser.add_argument(
        "--orphan-wait", type=float, default=60.0, help="seconds for ranks to end by themselves"
    )
    parser.add_argument("--workdir", type=Path, help="default: a new temporary folder, deleted at the end")
    parser.add_argument("--json", type=Path, help="write the interruptions here")
    args = parser.parse_args(argv)
    kinds = list(KINDS) if args.kinds == "all" else args.kinds.split(",")
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="course_chaos_"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "jobs.log"
    shm_before = shm()

    reference = work / "reference"
    shown = " ".join(["torchrun", *job_command(Path("DIR"), args.steps, args.checkpoint_every)[3:]])
    print(f"chaos: {args.interruptions} interruptions, {args.per_run} a run, of: {shown}", flush=True)
    proc = start(job_command(reference, args.steps, args.checkpoint_every), process_tree.new_mark(), log)
    if proc.wait() != 0:
        print(f"the uninterrupted job failed (exit {proc.returncode}); see {log}", file=sys.stderr)
        return 1
    expected = [e for e in events(reference) if e["event"] == "finished"][-1]["sha256"]
    print(f"uninterrupted: params sha256 {expected}", flush=True)

    everything, runs_lost, left = [], 0, []
    runs = -(-args.interruptions // args.per_run)
    # every kind as often as the others (within one), in a random order
    plan = (kinds * -(-args.interruptions // len(kinds)))[: args.interruptions]
    aims = ([True, False] * args.interruptions)[: args.interruptions]  # half aimed at a save beginning
    rng.shuffle(plan), rng.shuffle(aims)
    print(
        f"{'run':>3} {'kind':<14}{'step':>5}  {'during a write':<15}{'complete':>9}{'stop ckpt':>10}"
        f"{'resumed':>8}  lost",
        flush=True,
    )
    for number in range(runs):
        folder = work / f"run{number}"
        shutil.copytree(reference / "data", folder / "data")  # the same data, not written again
        mine = slice(number * args.per_run, (number + 1) * args.per_run)
        command = job_command(folder, args.steps, args.checkpoint_every)
        done, digest, stayed = one_run(
            number, folder, command, plan[mine], aims[mine], rng, args.steps, args.orphan_wait, log
        )
        left += stayed
        lost_run = digest != expected or any(i.lost for i in done)
        runs_lost += lost_run
        everything += done
        for i in done:
            print(
                f"{i.run:>3} {i.kind:<14}{i.step:>5}  {'yes' if i.during_write else 'no':<15}"
                f"{i.newest_complete:>9}{'' if i.stop_checkpoint is None else i.stop_checkpoint:>10}"
                f"{'' if i.resumed_from is None else i.resumed_from:>8}  {'LOST' if i.lost else 'no'}",
                flush=True,
            )
        if digest != expected:
            print(
                f"run {number}: final params sha256 {digest} differs from the uninterrupted job's", flush=True
            )
        if not args.workdir:
            shutil.rmtree(folder, ignore_errors=True)
    new_shm = sorted(shm() - shm_before)

    print("\ninterruptions by kind and moment:")
    counts = Counter((i.kind, i.during_write) for i in everything)
    print(f"  {'kind':<14}{'during a write':>15}{'between writes':>16}")
    for kind in kinds:
        print(f"  {kind:<14}{counts[kind, True]:>15}{counts[kind, False]:>16}")
    during = sum(i.during_write for i in everything)
    print(f"  {'all':<14}{during:>15}{len(everything) - during:>16}")
    print(f"\nruns: {runs}, interruptions: {len(everything)}, during a checkpoint write: {during}")
    print(
        f"lost: {runs_lost} runs; leftover processes: {len(left)}; leftover /dev/shm files: {len(new_shm)}"
        + (f" ({', '.join(new_shm)})" if new_shm else "")
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(i) for i in everything], indent=1))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    ok = not runs_lost and not left and not new_shm and during >= args.min_during_write
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
