"""The CPU tests, run again on a GPU machine (tests/gpu): ``launch`` gives each rank a GPU and
NCCL where there are enough GPUs, so the same tests take the CUDA and NCCL paths."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cpu_tests(*node_ids: str, timeout: float = 1800) -> None:
    """Run these tests (``tests/test_x.py::test_y[id]``) in a fresh pytest; each must pass, none skip."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and summary.startswith(f"{len(node_ids)} passed"), (
        done.stdout[-4000:] + done.stderr[-2000:]
    )
