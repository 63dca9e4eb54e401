"""The chaos tool's short version: the production job interrupted 4 times (one of each kind: a rank
SIGKILLed under --max-restarts, SIGINT and SIGTERM to torchrun, torchrun SIGKILLed), half of them
aimed at a checkpoint write; it ends with the uninterrupted job's parameters, resumes from no earlier
than the newest checkpoint it had, and leaves no process and no /dev/shm file. The full run, 30
interruptions, is done by hand (``python tools/chaos.py --interruptions 30``)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.chapter(8), pytest.mark.launches]


def test_four_interruptions_lose_nothing_and_leave_nothing(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "chaos.py"),
            "--interruptions",
            "4",
            "--per-run",
            "4",
            "--seed",
            "1",
            "--min-during-write",
            "1",
            "--json",
            str(tmp_path / "chaos.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "lost: 0 runs; leftover processes: 0; leftover /dev/shm files: 0" in done.stdout
    import json

    kinds = sorted(i["kind"] for i in json.loads((tmp_path / "chaos.json").read_text()))
    assert set(kinds) <= {"kill-rank", "kill-torchrun", "sigint", "sigterm"} and len(kinds) >= 3
