"""Run a SLURM batch script on this one machine, with stand-ins for ``srun`` and ``scontrol``.

A real cluster runs ``sbatch job.sbatch``: SLURM picks the nodes, sets ``SLURM_*``
variables and runs the script on the first node, whose ``srun`` starts one task per
node. Here ``run_sbatch_locally`` sets the same variables, puts two tiny shell
stand-ins first on ``PATH`` (``scontrol show hostnames`` prints ``127.0.0.1`` once per
"node"; ``srun`` starts its command once per "node" with ``SLURM_NODEID`` / ``SLURM_PROCID``
set, fails if any copy fails, and with ``--kill-on-bad-exit=1`` ends the other copies as soon
as one fails) and runs the script with ``bash``, with a timeout,
through the chapter 02 runner (on a failure, everything it started is stopped). As SLURM
gives each node its own GPUs, the ``srun`` stand-in gives each "node" its own slice of
this machine's, or gloo where there are too few (``runner.node_environments``).

Taught in chapter 08 (appendix 08c, section 2, a SLURM batch script; a lost node, requeue and
resume).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from course_utils.runtime import runner
from course_utils.runtime.ports import free_port

__all__ = ["run_sbatch_locally", "sbatch_template", "FAKE_SRUN", "FAKE_SCONTROL"]

FAKE_SCONTROL = """#!/bin/bash
# stand-in for `scontrol show hostnames LIST`: this machine, once per node;
# and for `scontrol requeue JOBID`: says so (the caller runs the script again)
case "$1" in
    show) for ((i = 0; i < SLURM_NNODES; i++)); do echo 127.0.0.1; done ;;
    requeue) echo "scontrol: job $2 requeued" ;;
    *) echo "scontrol stand-in: only 'show hostnames' and 'requeue' are known" >&2; exit 1 ;;
esac
"""

FAKE_SRUN = """#!/bin/bash
# stand-in for `srun [options] CMD...`: CMD once per node, in parallel; fail if any copy fails.
# --kill-on-bad-exit=1 (or -K): as soon as one copy fails, end the others (SIGTERM), as srun does.
kill_on_bad_exit=0
while [[ "$1" == -* ]]; do
    case "$1" in
        -K | --kill-on-bad-exit | --kill-on-bad-exit=1) kill_on_bad_exit=1 ;;
    esac
    shift
done
pids=()
# srun forwards the signals it gets to its tasks (SIGTERM here, from the batch script's trap)
forwarded=0
trap 'forwarded=1; kill -TERM "${pids[@]}" 2>/dev/null' TERM
for ((node = 0; node < SLURM_NNODES; node++)); do
    own="COURSE_NODE${node}_ENV"          # this node's own variables (its GPUs), if any
    env ${!own:-} SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" &
    pids+=($!)
done
# Poll rather than `wait -n`: copies that end before `wait -n` is reached can be reaped
# without being reported, and `wait -n` then answers 127 (no child left) for a job that passed.
# `wait PID` always returns that copy's own status, however early it ended.
status=0
running=("${pids[@]}")
while ((${#running[@]} > 0)); do
    still=()
    for pid in "${running[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            still+=("$pid")
            continue
        fi
        wait "$pid"
        code=$?
        if ((code != 0 && status == 0)); then
            status=$code
            echo "srun: a task exited with status $code" >&2
            if ((kill_on_bad_exit && !forwarded)); then
                echo "srun: --kill-on-bad-exit: terminating the other tasks" >&2
                kill -TERM "${pids[@]}" 2>/dev/null
            fi
        fi
    done
    running=("${still[@]}")
    ((${#running[@]} > 0)) && sleep 0.1
done
exit $status
"""


def sbatch_template(name: str = "slurm_torchrun.sbatch") -> Path:
    """The course's SLURM batch script ``templates/<name>``: a checkout's own file, or the copy a
    wheel install carries (package ``course_utils.templates``)."""
    import importlib.resources

    import course_utils

    in_checkout = Path(course_utils.__file__).resolve().parents[1] / "templates" / name
    if in_checkout.is_file():
        return in_checkout
    installed = Path(str(importlib.resources.files("course_utils.templates") / name))
    if not installed.is_file():
        raise FileNotFoundError(
            f"no {name} in {in_checkout.parent} nor in the installed course_utils.templates"
        )
    return installed


def run_sbatch_locally(
    script: str | os.PathLike,
    *,
    nodes: int = 2,
    env: dict | None = None,
    timeout: float = 180.0,
    signal_when: tuple[int, Callable[[], bool]] | None = None,
) -> tuple[str, str]:
    """Run ``bash script`` as SLURM would on ``nodes`` nodes (all of them this machine).

    env: extra variables (e.g. ``GPUS_PER_NODE``, ``CKPT_DIR``, ``TRAIN_ARGS``). A requeued
    job is the same script run again with the same ``SLURM_JOB_ID`` and
    ``SLURM_RESTART_COUNT`` one higher: pass ``{"SLURM_RESTART_COUNT": "1"}``.
    ``MASTER_PORT`` is a free port unless given. ``GPUS_PER_NODE`` (the template's default
    is 8) decides whether each node can have GPUs of its own here.
    signal_when: ``(signal, ready)``: send ``signal`` to the batch shell once ``ready()`` is true,
    as SLURM does for ``--signal=B:USR1@120`` before the time limit (``ready`` stands in for the
    clock: a training step reached, say).
    Returns the script's (stdout, stderr); raises ``runner.LauncherError`` if it fails or
    outlives ``timeout``.
    """
    sent = []

    def deliver(procs) -> None:
        if signal_when is not None and not sent and signal_when[1]():
            procs[0].send_signal(signal_when[0])  # the batch shell: `env` has exec'd bash
            sent.append(True)

    with tempfile.TemporaryDirectory(prefix="course_slurm_") as shims:
        for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
            path = Path(shims) / name
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        variables = {
            "SLURM_NNODES": str(nodes),
            "SLURM_JOB_NODELIST": f"localhost[1-{nodes}]",
            "SLURM_JOB_ID": "4242",
            "SLURM_CPUS_PER_TASK": str(os.cpu_count() or 1),
            "MASTER_PORT": str(free_port()),
            "PATH": os.pathsep.join([shims, str(Path(sys.executable).parent), os.environ["PATH"]]),
            **(env or {}),
        }
        per_node = int(variables.get("GPUS_PER_NODE", os.environ.get("GPUS_PER_NODE", "8")))
        for node, own in enumerate(runner.node_environments(nodes, per_node)):
            if own:
                variables[f"COURSE_NODE{node}_ENV"] = " ".join(f"{k}={v}" for k, v in own.items())
        command = ["env", *(f"{k}={v}" for k, v in variables.items()), "bash", str(script)]
        (outputs,), _ = runner.run_together([command], timeout, watch=deliver)
    return outputs
