"""Run the scripts of this package under a real launcher, from a notebook or a test.

``run_torchrun`` starts ``torchrun`` (or the deprecated ``torch.distributed.launch``)
as a subprocess, one per "node" (``nnodes=2`` gives two launchers on localhost
forming one world), gives every rank a folder for its report (``--out``), and
returns the reports in global-rank order. ``spawn_and_wait`` is
``torch.multiprocessing.spawn`` with a timeout. Whatever happens, nothing is
left running: a launcher that fails or outlives ``timeout``, its partners, and every
process they started (torchrun's workers run in sessions of their own, so killing a
launcher's process group would miss them) get SIGTERM, a grace period, then SIGKILL
(``process_tree.stop_tree``), on a timeout, a failed partner or Ctrl-C alike.

The launchers run on this one machine, so gloo's and NCCL's sockets are put on the loopback
interface (``loopback.loopback_environment``) and each c10d rendezvous gets a random id.
torchrun's own rendezvous store still listens on every interface: torch has no option to
confine it (``runtime/loopback.py``).

Taught in chapter 02 (section 5, torchrun; appendix 02a, section 4, the other launchers);
chapters 04 and 08 run their scripts with it.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch.multiprocessing as mp

import course_utils
from course_utils.runtime import hardware, loopback, process_tree
from course_utils.runtime.launcher.output import engine_line
from course_utils.runtime.ports import free_port
from course_utils.runtime.stderr_report import port_hint, stderr_tail

# The `torchrun` command is this module's console script; running it through the
# current interpreter works even where the venv's bin/ folder is not on PATH.
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    "torch.distributed.launch": [sys.executable, "-m", "torch.distributed.launch"],
}
#: The folder that holds the ``course_utils`` package: the checkout's root in a checkout,
#: site-packages in a wheel install (``pip install git+...``, as on Colab).
PACKAGE_ROOT = str(Path(course_utils.__file__).resolve().parent.parent)
#: The course's torchrun scripts pass this variable to ``pick_backend`` ("auto" when unset).
BACKEND_VARIABLE = "COURSE_BACKEND"


def node_environments(nnodes: int, nproc_per_node: int) -> list[dict[str, str]]:
    """The extra environment of each of ``nnodes`` stand-in nodes started on this one machine.

    Real nodes have GPUs of their own. Stand-ins share this machine's, and each would give
    its local rank 0 ``cuda:0``: NCCL refuses two ranks on one GPU ("Duplicate GPU
    detected"). So when the visible GPUs are enough for one per rank, each node gets its
    own slice of them (``CUDA_VISIBLE_DEVICES``, as SLURM gives each node its GPUs); else
    every node runs gloo (``COURSE_BACKEND=gloo``: all nodes must agree on the backend).
    One node, or no GPU at all, needs nothing.
    """
    gpus = hardware.gpu_count() if nnodes > 1 else 0
    if gpus == 0:
        return [{} for _ in range(nnodes)]
    if gpus < nnodes * nproc_per_node:
        return [{BACKEND_VARIABLE: "gloo"} for _ in range(nnodes)]
    # slices of what this process sees: CUDA_VISIBLE_DEVICES=2,3 here gives the nodes "2" and "3"
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d.strip() for d in listed.split(",")][:gpus] if listed else [str(i) for i in range(gpus)]
    return [
        {"CUDA_VISIBLE_DEVICES": ",".join(visible[n * nproc_per_node : (n + 1) * nproc_per_node])}
        for n in range(nnodes)
    ]


class LauncherError(RuntimeError):
    """A launcher exited with an error or was stopped after its timeout.

    ``stderr``: the whole stderr of the launcher that failed (its ranks' too), "" after a timeout.
    """

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


@dataclass
class LauncherRun:
    """What a run left: one report per rank (global-rank order), and each launcher's output.

    ``commands`` are the command lines as a learner would type them (``torchrun ...``,
    with ``PORT`` and ``OUT`` for the parts that change from run to run).
    """

    reports: list[dict]
    commands: list[str]
    stderr: list[str] = field(repr=False)
    stdout: list[str] = field(repr=False)
    launcher_pids: list[int] = field(repr=False)
    seconds: float = 0.0

    def said(self, launcher: int = 0) -> str:
        """The last line a launcher's ranks printed: the script's own result line. The ranks share
        the launcher's stdout, so engine lines that several print at start-up (torch 2.9's gloo:
        "[Gloo] Rank 0 is connected to 1 peer ranks") can come interleaved, mid-line."""
        lines = self.stdout[launcher].strip().splitlines()
        return lines[-1] if lines else ""


def _rendezvous(kind: str, port: int) -> list[str]:
    if kind == "standalone":
        return ["--standalone"]  # one node: a c10d rendezvous on a free local port
    if kind == "static":
        return ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    if kind == "c10d":  # a random id: the store holds the rendezvous under it (and unpickles it)
        run_id = uuid.uuid4().hex
        return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
    raise ValueError(f"rendezvous must be 'standalone', 'static' or 'c10d', got {kind!r}")


def run_torchrun(
    module: str = "course_utils.scripts.hello",
    nproc_per_node: int = 2,
    nnodes: int = 1,
    rendezvous: str = "standalone",
    launcher: str = "torchrun",
    timeout: float = 120.0,
    port: int | None = None,
    args: Sequence[str] = (),
) -> LauncherRun:
    """Run ``launcher ... -m module --out DIR *args`` once per node on this machine; return the reports.

    ``nnodes > 1`` starts one launcher per node (``--node-rank 0 .. nnodes-1``) that meet at
    ``127.0.0.1:port`` (a free port unless given) with a ``static`` or ``c10d`` rendezvous;
    on a GPU machine each node gets its own GPUs, or gloo (``node_environments``).
    Raises ``LauncherError`` naming the launcher that failed (with the end of its
    stderr), or saying which were still running after ``timeout`` s.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if nnodes > 1 and rendezvous == "standalone":
        raise ValueError("--standalone is for one node; for nnodes > 1 use rendezvous='static' or 'c10d'")
    port = free_port() if port is None else port
    node_env = node_environments(nnodes, nproc_per_node)
    meeting = _rendezvous(rendezvous, port)  # the same for every node
    with tempfile.TemporaryDirectory(prefix="course_run_") as out:
        commands = []
        for node in range(nnodes):
            nodes = ["--nnodes", str(nnodes), "--node-rank", str(node)] if nnodes > 1 else []
            commands.append(
                LAUNCHERS[launcher]
                + [
                    "--nproc-per-node",
                    str(nproc_per_node),
                    *nodes,
                    *meeting,
                    "-m",
                    module,
                    "--out",
                    out,
                    *map(str, args),
                ]
            )
        start = time.perf_counter()
        outputs, pids = run_together(commands, timeout, node_env)
        reports = [
            json.loads(p.read_text())
            for p in sorted(Path(out).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        ]
        shown = [
            " ".join(
                [f"{k}={v}" for k, v in extra.items()]
                + [launcher if launcher == "torchrun" else f"python -m {launcher}"]
                + c[len(LAUNCHERS[launcher]) :]
            )
            .replace(out, "OUT")
            .replace(str(port), "PORT")
            .replace(meeting[-1], "RUN_ID" if rendezvous == "c10d" else meeting[-1])
            for c, extra in zip(commands, node_env, strict=False)
        ]
    return LauncherRun(
        reports, shown, [e for _, e in outputs], [o for o, _ in outputs], pids, time.perf_counter() - start
    )


def run_together(
    commands: list[list[str]],
    timeout: float,
    extra_env: Sequence[dict] | None = None,
    watch: Callable[[list[subprocess.Popen]], None] | None = None,
    grace: float = 5.0,
    stop_partners: bool = True,
) -> tuple[list[tuple[str, str]], list[int]]:
    """Start every command at once; all finish, or all are stopped with everything they started.

    ``extra_env``: variables to add for each command (one dict per command), e.g. its GPUs.
    ``watch``: called with the running processes every 50 ms while they run (to signal them).
    ``stop_partners=False``: a launcher that fails does not stop the others; each runs until it
    ends or the timeout (to see what the survivors of a lost node do).
    On a failure, a timeout or an exception (Ctrl-C), every launcher still running gets SIGTERM
    and ``grace`` seconds to end, then SIGKILL, with every process it started
    (``process_tree.stop_tree``); whatever of theirs outlived a launcher that ended is stopped too.
    """
    # PYTHON_COLORS=0: plain tracebacks (Jupyter sets FORCE_COLOR; Python 3.13 then adds ANSI codes)
    mark = process_tree.new_mark()  # inherited by every process the launchers start
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHON_COLORS": "0",
        **_pythonpath(),
        **loopback.loopback_environment(),
        **mark,
    }
    procs, files = [], []
    try:
        for cmd, extra in zip(commands, extra_env or [{}] * len(commands), strict=False):
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files.append((out, err))
            procs.append(
                subprocess.Popen(cmd, stdout=out, stderr=err, env={**env, **extra}, start_new_session=True)
            )
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if (failed and stop_partners) or time.monotonic() > deadline:
                break
            if watch is not None:
                watch(procs)
            time.sleep(0.05)
        running = [i for i, p in enumerate(procs) if p.poll() is None]
    finally:
        process_tree.stop_tree(procs, mark, grace=grace)
    outputs = []
    for out, err in files:
        out.seek(0), err.seek(0)
        # gloo's "[Gloo] Rank 0 is connected to ..." (torch 2.9) and c10 log lines are the
        # engines' talk, not the program's output
        stdout = "".join(ln for ln in out.read().splitlines(keepends=True) if not engine_line(ln))
        outputs.append((stdout, err.read()))
        out.close(), err.close()
    failed = [i for i, p in enumerate(procs) if p.returncode != 0 and i not in running]
    if failed:
        i = failed[0]
        raise LauncherError(
            f"launcher {i} of {len(procs)} exited with code {procs[i].returncode}"
            f"{port_hint(outputs[i][1])}; the end of its stderr:\n{stderr_tail(outputs[i][1])}",
            stderr=outputs[i][1],
        )
    if running:
        raise LauncherError(
            f"launcher(s) {running} of {len(procs)} were still running after "
            f"{timeout:g} s and were stopped (a node that never joins the rendezvous "
            "makes the others wait; pass a larger timeout if they were only slow)"
        )
    return outputs, [p.pid for p in procs]


def _pythonpath() -> dict[str, str]:
    """``PYTHONPATH`` for the launchers and their ranks, so that they import the course_utils
    this process runs, wherever the working directory is: ``PACKAGE_ROOT`` first, unless it
    is a site-packages folder, which Python finds by itself (on PYTHONPATH it would come
    before the standard library). ``{}`` when nothing needs to change."""
    sites = {os.path.realpath(p) for p in site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        sites.add(os.path.realpath(site.getusersitepackages()))
    if PACKAGE_ROOT in sites:
        return {}
    return {"PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}


def spawn_and_wait(fn, args: tuple, nprocs: int, timeout: float = 120.0) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)``, stopped after ``timeout`` s.

    ``mp.spawn`` starts ``nprocs`` fresh interpreters and calls ``fn(i, *args)`` in
    process ``i``; ``fn`` must be importable (a module-level function, not one defined
    in a notebook cell). A process that raises makes this raise (mp.spawn's
    ``ProcessRaisedException``, with that process's traceback); one that is still
    running after ``timeout`` makes it raise ``LauncherError``; either way none survives, nor
    anything it started (``process_tree.stop_processes``).
    """
    context = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=0.1):
            if time.monotonic() > deadline:
                running = [i for i, p in enumerate(context.processes) if p.is_alive()]
                raise LauncherError(
                    f"process(es) {running} of mp.spawn were still running after "
                    f"{timeout:g} s and were stopped"
                )
    finally:
        process_tree.stop_processes([p.pid for p in context.processes if p.is_alive()])
        for proc in context.processes:
            proc.join()
