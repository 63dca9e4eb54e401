"""Fixtures shared by the test files (with tests/helpers/: no test file imports another)."""

import gc
import os
import signal
import threading
import time

import matplotlib
import pytest
import torch


@pytest.fixture
def meta_as_gpu(monkeypatch):
    """Meta tensors stand in for GPU tensors: ``Tensor.cpu`` of a meta tensor gives zeros of its
    shape (and leaves other tensors alone); returns the list of shapes copied, in order."""
    copied = []

    def cpu(self):
        copied.append(tuple(self.shape))
        return torch.zeros(self.shape, dtype=self.dtype) if self.device.type == "meta" else self

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    return copied


@pytest.fixture(scope="module")
def agg_backend():
    """Draw with Agg (no display) in the module that asks for it, then give the session its
    backend back (``pytestmark = pytest.mark.usefixtures("agg_backend")``)."""
    before = matplotlib.get_backend()
    matplotlib.use("Agg")
    yield
    matplotlib.use(before)


@pytest.fixture
def no_garbage_before_fork():
    """Collect garbage here before launch() forks ranks. A failed launch leaves garbage (held by the
    exception's traceback) that owns native threads; collected inside a forked rank, its destructor
    would abort that rank (std::system_error, "Invalid argument"). The ranks gc.freeze() what they
    inherit (launcher/rank_entry.py), so that no longer happens; collecting here still keeps the
    garbage of a module's deliberately failing launches out of the next forks. A module asks for it
    with ``pytest.mark.usefixtures("no_garbage_before_fork")`` (test_ddp.py, test_ddp_data.py,
    test_loaders.py)."""
    gc.collect()


STOPPED_AFTER_S = 0.3  # when "torchrun" stops a rank other than 0 in job_main


@pytest.fixture
def job_main(monkeypatch):
    """``train_hybrid.main`` in this process, as rank ``rank`` of 2 under torchrun:
    ``run(argv, rank=0)`` returns its exit code (what it printed: ``capsys``). The job's input
    checks come before its process group; one that lets the input through fails the test. A rank
    other than 0 must wait for torchrun to stop it (its SIGTERM, sent here ``STOPPED_AFTER_S`` in,
    as once rank 0 has ended): one that ends before fails the test."""
    from course_utils.scripts import train_hybrid

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def checks_let_it_through(*args, **kwargs):
        raise AssertionError("the job went on to start its process group: no check refused this input")

    monkeypatch.setattr(torch.distributed, "init_process_group", checks_let_it_through)

    def run(argv: list[str], rank: int = 0) -> int:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29999")  # never reached: the checks come first
        ended = threading.Event()

        def torchrun_stops_it():  # once main() listens for SIGTERM (its StopFlag), a while later
            while signal.getsignal(signal.SIGTERM) == handlers[signal.SIGTERM] and not ended.is_set():
                time.sleep(0.01)
            if not ended.wait(STOPPED_AFTER_S):
                os.kill(os.getpid(), signal.SIGTERM)

        stopper = threading.Thread(target=torchrun_stops_it, daemon=True)
        if rank != 0:
            stopper.start()
        began = time.monotonic()
        try:
            with pytest.raises(SystemExit) as exit_:
                train_hybrid.main(argv)
        finally:
            ended.set()
            if stopper.is_alive():
                stopper.join()
            for sig, handler in handlers.items():  # main() installs the job's stop handlers
                signal.signal(sig, handler)
        if rank != 0 and time.monotonic() - began < STOPPED_AFTER_S:
            raise AssertionError(f"rank {rank} ended before torchrun stopped it: rank 0 may not have spoken")
        return exit_.value.code

    return run
