"""launch() from a real Jupyter kernel: a function defined in a cell, re-runs, timeouts, interrupts."""

import os
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.chapter(0), pytest.mark.launches]

jupyter_client = pytest.importorskip("jupyter_client")

CELL_FUNCTIONS = """
import os, time
import torch, torch.distributed as dist
from course_utils import launch

def greet():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    print(f"hi from rank {dist.get_rank()}, sum of ranks {t.item():g}")
    return dist.get_rank()

def skip_a_collective():
    open(f"pid{dist.get_rank()}", "w").write(str(os.getpid()))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))

def sleep_forever():
    open(f"pid{dist.get_rank()}", "w").write(str(os.getpid()))
    time.sleep(600)
"""

GREET = "print(launch(greet, world_size=3, timeout=60))"
GREET_OUTPUT = "".join(f"[rank {r}] hi from rank {r}, sum of ranks 3\n" for r in range(3)) + "[0, 1, 2]\n"


class Kernel:
    """A python3 kernel in a scratch folder; ``run(code)`` returns (stdout, stderr, error name)."""

    def __init__(self, cwd: Path):
        self.manager = jupyter_client.KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 120):
        out, err, error = [], [], []

        def hook(msg):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                (out if content["name"] == "stdout" else err).append(content["text"])
            elif kind == "error":
                error.append(content["ename"])

        self.client.execute_interactive(code, output_hook=hook, timeout=timeout)
        return "".join(out), "".join(err), (error[0] if error else None)

    def close(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    assert k.run(CELL_FUNCTIONS)[2] is None
    yield k
    k.close()


def _gone(folder: Path, world_size: int) -> bool:
    pids = [int((folder / f"pid{r}").read_text()) for r in range(world_size)]
    for pid in pids:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            pass
    return True


def test_function_defined_in_a_cell_runs_on_ranks(kernel):
    assert kernel.run(GREET) == (GREET_OUTPUT, "", None)


def test_same_cell_twenty_times(kernel):
    for i in range(20):
        assert kernel.run(GREET) == (GREET_OUTPUT, "", None), f"run {i}"


def test_timeout_in_kernel_then_next_launch_works(kernel):
    folder = Path(kernel.run("print(os.getcwd())")[0].strip())
    out, err, error = kernel.run("launch(skip_a_collective, world_size=2, timeout=3)")
    assert error == "LaunchTimeoutError"
    assert _gone(folder, 2)
    assert kernel.run(GREET) == (GREET_OUTPUT, "", None)


def test_interrupt_stops_the_ranks_and_the_kernel_carries_on(kernel):
    folder = Path(kernel.run("print(os.getcwd())")[0].strip())
    for r in range(2):
        (folder / f"pid{r}").unlink(missing_ok=True)

    def interrupt_when_started():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all((folder / f"pid{r}").exists() for r in range(2)):
            time.sleep(0.05)
        time.sleep(0.3)
        kernel.manager.interrupt_kernel()

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    start = time.monotonic()
    out, err, error = kernel.run("launch(sleep_forever, world_size=2, timeout=120)")
    assert error == "KeyboardInterrupt"
    assert time.monotonic() - start < 30
    assert _gone(folder, 2)
    assert kernel.run(GREET) == (GREET_OUTPUT, "", None)
