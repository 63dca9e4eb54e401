"""Start a training job (``elastic_train``, ``train_hybrid``) under the real ``torchrun``; read what happened.

``run_elastic`` starts one ``torchrun`` per node (``nnodes=2``: two launchers on
localhost meeting through a c10d rendezvous on a free port; on a GPU machine each gets
its own GPUs, or gloo, see ``runner.node_environments``), with a timeout; if a
launcher fails or outlives it, every launcher and every process it started is stopped
(SIGTERM, a grace period, SIGKILL: the runner of chapter 02 does the process handling).
The c10d rendezvous id is random, shown as ``RUN_ID``. ``timeline`` turns the ranks'
event logs into a deterministic account, attempt by attempt; ``plot_restarts`` draws it.
``terminate_at_step`` sends the launchers SIGTERM mid-run, as a cluster does before a time limit.

Taught in chapter 08 (section 5, the production job under ``torchrun``; appendix 08c, section 1,
two nodes).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.runtime import runner
from course_utils.runtime.ports import free_port

__all__ = [
    "ElasticRun",
    "run_elastic",
    "read_events",
    "finished",
    "timeline",
    "plot_restarts",
    "SHARED_STORE_FIX",
]

# torchrun's agent shares its TCPStore with the ranks by default (torch >= 2.5); after a
# restart the new ranks can read the previous attempt's addresses from it and fail to
# connect (pytorch/pytorch#135712, seen here with gloo on torch 2.13). Each attempt's
# rank 0 hosting its own store avoids that.
SHARED_STORE_FIX = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass
class ElasticRun:
    """What a run left: every rank's events (in order), the command lines, the launchers' stderr."""

    events: list[dict]
    commands: list[str]
    stderr: list[str] = field(repr=False)
    out: Path = field(repr=False)
    terminated: bool = False  # SIGTERM was sent to the launchers (``terminate_at_step``)


def read_events(out: str | os.PathLike) -> list[dict]:
    """All ``events-rank<R>.jsonl`` lines of a run, ordered by attempt, rank, then as written."""
    events = []
    for path in sorted(Path(out).glob("events-rank*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: (e["attempt"], e["rank"], e["time"]))


def finished(events: list[dict]) -> dict:
    """Rank 0's last ``finished`` event (``train_hybrid``'s: ``step``, ``auc``, ``sha256``)."""
    ends = [e for e in events if e["event"] == "finished" and e["rank"] == 0]
    if not ends:
        raise ValueError("the job never finished: rank 0 logged no 'finished' event (see timeline(events))")
    return ends[-1]


def run_elastic(
    out: str | os.PathLike,
    *,
    nproc_per_node: int = 2,
    nnodes: int = 1,
    max_restarts: int = 1,
    timeout: float = 180.0,
    script_args: list[str] | tuple = (),
    module: str = "course_utils.scripts.elastic_train",
    out_flag: str = "--out",
    terminate_at_step: int | None = None,
    stop_partners: bool = True,
) -> ElasticRun:
    """``torchrun [--standalone | --nnodes N --rdzv-backend c10d ...] --nproc-per-node P
    --max-restarts R -m MODULE OUT_FLAG OUT *script_args``, one per node. ``module``: a script
    that logs events with ``job_events`` (``elastic_train``, or ``train_hybrid`` with
    ``out_flag="--checkpoint-dir"``).

    ``terminate_at_step``: once some rank has logged that step, send SIGTERM to every launcher
    (as SLURM does before a time limit); the launchers then exit with an error, which is expected
    (``ElasticRun.terminated``). Otherwise raises ``runner.LauncherError`` if a launcher fails
    (e.g. more failures than restarts) or is still running after ``timeout`` seconds; nothing is
    left running either way. ``stop_partners=False``: a failed launcher does not end the others at
    once (as on a cluster, where nobody does that for them): the error comes when all have ended.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    port, run_id = free_port(), uuid.uuid4().hex  # the id names the rendezvous in the store: random
    commands = []
    for own in runner.node_environments(nnodes, nproc_per_node):
        env = ["env", *(f"{k}={v}" for k, v in {**SHARED_STORE_FIX, **own}.items())]
        where = (
            ["--standalone"]
            if nnodes == 1
            else [
                "--nnodes",
                str(nnodes),
                "--rdzv-backend",  # c10d numbers the nodes as they join: no --node-rank
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                run_id,
            ]
        )
        commands.append(
            env
            + runner.LAUNCHERS["torchrun"]
            + [
                *where,
                "--nproc-per-node",
                str(nproc_per_node),
                "--max-restarts",
                str(max_restarts),
                "-m",
                module,
                out_flag,
                str(out),
                *map(str, script_args),
            ]
        )
    signalled = []

    def terminate_when_due(procs) -> None:
        if signalled or not any(
            e["event"] == "step" and e["step"] >= terminate_at_step for e in read_events(out)
        ):
            return
        for proc in procs:
            proc.send_signal(signal.SIGTERM)  # the launcher only: torchrun passes it on to its ranks
        signalled.append(True)

    try:
        outputs, _ = runner.run_together(
            commands,
            timeout,
            watch=None if terminate_at_step is None else terminate_when_due,
            stop_partners=stop_partners,
        )
        stderr = [e for _, e in outputs]
    except runner.LauncherError as error:
        if not signalled:
            raise
        stderr = [error.stderr]
    launcher = " ".join(runner.LAUNCHERS["torchrun"])
    shown = [
        " ".join(c)
        .replace(launcher, "torchrun")
        .replace(str(out), "OUT")
        .replace(str(port), "PORT")
        .replace(run_id, "RUN_ID")
        .replace("env ", "")
        for c in commands
    ]
    return ElasticRun(read_events(out), shown, stderr, out, terminated=bool(signalled))


def _steps(events: list[dict], attempt: int) -> list[int]:
    """The steps some rank finished in ``attempt``. (When a rank dies, the others are stopped
    a moment later, sometimes before they have logged the step they were finishing; the rank
    that died logged every step before its death.)"""
    return sorted({e["step"] for e in events if e["attempt"] == attempt and e["event"] == "step"})


def timeline(events: list[dict]) -> list[str]:
    """One deterministic line per thing that happened, attempt by attempt (no wall times)."""
    lines = []
    for attempt in sorted({e["attempt"] for e in events}):
        mine = [e for e in events if e["attempt"] == attempt]
        ranks = sorted({e["rank"] for e in mine})
        start = [e for e in mine if e["event"] in ("started", "resumed")]
        how = (
            "started from scratch"
            if all(e["event"] == "started" for e in start)
            else f"resumed from the checkpoint of step {start[0]['step']}"
        )
        lines.append(f"attempt {attempt}: ranks {ranks} {how}")
        steps = _steps(events, attempt)
        if steps:
            lines.append(f"  steps {steps[0]}..{steps[-1]} done")
        saved = [e["step"] for e in mine if e["event"] == "checkpoint"]
        if saved:
            lines.append(f"  rank 0 saved checkpoints at steps {saved}")
        for e in mine:
            if e["event"] == "killed" and e.get("what") == "rendezvous-host":
                lines.append(
                    f"  before step {e['step']}: the node whose torchrun hosted the rendezvous store lost "
                    "its torchrun and its rank (SIGKILL)"
                )
            elif e["event"] == "killed" and e.get("what", "rank") == "node":
                lines.append(
                    f"  rank {e['rank']} killed its torchrun agent, then itself, with SIGKILL before "
                    f"step {e['step']}: its whole node was gone"
                )
            elif e["event"] == "killed":
                lines.append(
                    f"  rank {e['rank']} killed itself with SIGKILL before step {e['step']}; "
                    "torchrun stopped the other ranks and restarted all of them"
                )
        stopped = sorted({e["step"] for e in mine if e["event"] == "stopped"})
        if stopped:
            lines.append(
                f"  SIGTERM: the ranks agreed to stop after step {stopped[0]}, saved a final checkpoint "
                "and exited"
            )
        finished = [e for e in mine if e["event"] == "finished"]
        if finished:
            lines.append(
                f"  finished at step {finished[0]['step']} on ranks {sorted(e['rank'] for e in finished)}"
            )
    return lines


def plot_restarts(events: list[dict], title: str = "elastic training: what happened"):
    """Steps done per attempt (bars; hatched: steps an earlier attempt had already done, the
    work redone), checkpoints (ticks), the kill (a cross), resumes (arrows)."""
    import matplotlib.pyplot as plt

    attempts = sorted({e["attempt"] for e in events})
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(attempts)), dpi=90)
    done_before: set[int] = set()
    for y, attempt in enumerate(attempts):
        mine = [e for e in events if e["attempt"] == attempt]
        steps = _steps(events, attempt)
        for step in steps:
            redone = step in done_before
            ax.barh(
                y,
                1,
                left=step - 1,
                height=0.5,
                color="tab:orange" if redone else "tab:blue",
                alpha=0.6,
                hatch="///" if redone else None,
                edgecolor="black" if redone else "none",
                linewidth=0,
            )
        done_before |= set(steps)
        for e in mine:
            if e["event"] == "checkpoint":
                ax.plot(e["step"], y, marker="|", markersize=20, markeredgewidth=3, color="tab:green")
            elif e["event"] == "killed":
                ax.plot(e["step"] - 0.5, y, marker="X", markersize=12, color="tab:red")
            elif e["event"] == "resumed" and e["rank"] == 0:
                ax.annotate(
                    "resume",
                    (e["step"], y),
                    (e["step"], y - 0.45),
                    ha="center",
                    fontsize=8,
                    arrowprops=dict(arrowstyle="->"),
                )
    ax.set_yticks(range(len(attempts)), [f"attempt {a}" for a in attempts])
    ax.invert_yaxis()
    ax.set_xlabel("training step (blue: done; orange, hatched: redone; green: checkpoint; red: rank killed)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
