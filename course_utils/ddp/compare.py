"""Threads vs processes, and single process vs DataParallel vs DDP, on the same model and data.

``threads_vs_processes`` isolates the GIL: the same forward/backward work, done
by one thread after the other, by two threads at once, and by two processes
at once. ``step_times`` times the DDP variants step by step (on every rank).
``compare_single_dp_ddp`` trains the same DLRM on the same data with the same
global batches four ways and returns one row per way: samples/s, wall time, CPU
time of the busiest process, and the AUC and log loss the model reaches.
"""
from __future__ import annotations

import contextlib
import copy
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from ..data import ClickLogs
from ..data_parallel import DataParallelByHand
from ..hardware import devices
from ..launcher import launch
from ..models import DLRMConfig
from ..train import bce_loss
from .train import TrainSettings, ddp_worker, train_single

__all__ = ["forward_backward", "DLRMWork", "PythonWork", "one_torch_thread", "threads_vs_processes", "VARIANTS",
           "step_times", "compare_single_dp_ddp", "plot_comparison"]


def forward_backward(model: nn.Module, batch, steps: int) -> None:
    """``steps`` x (forward, BCE loss, backward) of ``model`` on one batch."""
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        bce_loss(model, batch).backward()


class DLRMWork:
    """One worker's share of work: ``steps`` forward/backward passes of its own DLRM on ``batch``.

    On the CPU, on purpose, also on GPU machines: ``threads_vs_processes`` measures what
    the GIL does to Python threads that share CPU cores, not the GPUs.
    """

    def __init__(self, model_config: DLRMConfig, batch, steps: int = 10):
        self.model_config, self.batch, self.steps = model_config, batch, steps

    def prepare(self) -> "DLRMWork":
        """A copy with its own model, warmed up (one pass), ready to be timed."""
        work = copy.copy(self)
        work.model = self.model_config.build(seed=0)
        forward_backward(work.model, self.batch, 1)
        return work

    def __call__(self) -> None:
        forward_backward(self.model, self.batch, self.steps)


class PythonWork:
    """One worker's share of pure-Python work (a loop of ``n`` multiply-adds): it holds the GIL throughout."""

    def __init__(self, n: int = 2_000_000):
        self.n = n

    def prepare(self) -> "PythonWork":
        return self

    def __call__(self) -> int:
        total = 0
        for i in range(self.n):
            total += i * i
        return total


@contextlib.contextmanager
def one_torch_thread():
    """Run the block with one torch (intra-op) thread, as every rank of ``launch`` has."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _timed_rank(work) -> float:
    job = work.prepare()
    dist.barrier()
    start = time.perf_counter()
    job()
    dist.barrier()                                         # until the slower rank is done
    return time.perf_counter() - start


def threads_vs_processes(work, repeats: int = 3) -> dict:
    """Seconds for two workers' shares of ``work`` (a ``DLRMWork`` or ``PythonWork``):

    ``sequential``: one thread does both shares, one after the other;
    ``threads``: two Python threads at once (DataParallel's ``parallel_apply``);
    ``processes``: two ranks of ``launch`` at once (DDP).
    Each figure is the best of ``repeats`` rounds (the least disturbed by other
    work on the machine), one torch thread each. Also returns the speed-ups over
    sequential, ``threads_speedup`` and ``processes_speedup`` (2.0 is perfect on 2 cores).
    """
    best = {"sequential": float("inf"), "threads": float("inf"), "processes": float("inf")}
    with one_torch_thread():
        jobs = [work.prepare(), work.prepare()]
        for _ in range(repeats):
            start = time.perf_counter()
            for job in jobs:
                job()
            best["sequential"] = min(best["sequential"], time.perf_counter() - start)

            workers = [threading.Thread(target=job) for job in jobs]
            start = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best["threads"] = min(best["threads"], time.perf_counter() - start)

            ranks = launch(_timed_rank, work, world_size=2, timeout=120, show_output=False)
            best["processes"] = min(best["processes"], max(ranks))
    best["threads_speedup"] = best["sequential"] / best["threads"]
    best["processes_speedup"] = best["sequential"] / best["processes"]
    return best


#: DDP variants ``step_times`` can run: name -> (kind, wrap options). "one bucket" holds every
#: gradient in a single bucket, which can only leave once backward has finished: no overlap.
VARIANTS = {"naive": ("naive", {}), "bucketed": ("bucketed", {}), "torch": ("torch", {}),
            "one bucket": ("bucketed", {"bucket_cap_mb": 1024.0, "first_bucket_cap_mb": 1024.0})}


def step_times(data, model_config: DLRMConfig, settings: TrainSettings, variants=("naive", "bucketed", "torch"),
               rounds: int = 2, warmup_steps: int = 2) -> dict:
    """On every rank (call through ``launch``): ``rounds`` x each DDP variant, interleaved.

    Returns ``{"seconds": {variant: [step seconds after the first warmup_steps of each run]},
    "states": {variant: this rank's final state_dict of the last round},
    "collectives": {variant: all-reduces the last run started (None for torch DDP)}}``.
    """
    seconds = {name: [] for name in variants}
    states, collectives = {}, {}
    for _ in range(rounds):
        for name in variants:
            kind, options = VARIANTS[name]
            run = ddp_worker(kind, data, model_config, settings, **options)
            seconds[name] += run.step_seconds[warmup_steps:]
            states[name], collectives[name] = run.state, run.collectives
    return {"seconds": seconds, "states": states, "collectives": collectives}


def _data_parallel(model: nn.Module) -> nn.Module:
    devs = devices(2, quiet=True)                  # two GPUs when there are, else CPU stand-ins
    return DataParallelByHand(model.to(devs[0]), devs)


def compare_single_dp_ddp(train: ClickLogs, test: ClickLogs, model_config: DLRMConfig, settings: TrainSettings,
                          timeout: float = 300):
    """Train the same DLRM on the same data, same global batches and steps, four ways (2 workers each):

    single process (1 thread) | DataParallel by hand (1 process, 2 threads) |
    DDP by hand, bucketed (2 processes) | torch DDP (2 processes).

    Returns a DataFrame indexed by the way, with ``samples/s``, ``wall s``,
    ``CPU s busiest`` (CPU seconds of the busiest process: the one process, or the
    DDP rank that used the most), ``AUC``, ``logloss`` (on ``test``) and ``steps``.
    Every process runs one torch thread.
    """
    import pandas as pd

    with one_torch_thread():
        # the same global batches as 2 DDP ranks: DataParallel's 2 replicas get exactly the ranks' rows
        runs = {"single process": [train_single(train, model_config, settings, 2, test)],
                "DataParallel (2 threads)": [train_single(train, model_config, settings, 2, test,
                                                          parallel=_data_parallel, desc="DataParallel")]}
        for name, kind in (("DDP by hand (2 processes)", "bucketed"), ("torch DDP (2 processes)", "torch")):
            runs[name] = launch(ddp_worker, kind, train, model_config, settings, test,
                                world_size=2, timeout=timeout, show_output=False)
    table = pd.DataFrame({name: {"samples/s": r[0].samples_per_s, "wall s": r[0].seconds,
                                 "CPU s busiest": max(x.cpu_seconds for x in r), "AUC": r[0].final["auc"],
                                 "logloss": r[0].final["logloss"], "steps": len(r[0].step_loss)}
                          for name, r in runs.items()}).T
    table["steps"] = table["steps"].astype(int)
    return table


def plot_comparison(table, ax=None):
    """Bar chart of ``samples/s`` per way of training, with each bar's AUC written on it."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3), dpi=90)
    colours = ["#888888", "#d98c3f", "#3f7fd9", "#2a5599"][:len(table)]
    bars = ax.barh(table.index[::-1], table["samples/s"][::-1], color=colours[::-1])
    for bar, auc in zip(bars, table["AUC"][::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f"  AUC {auc:.3f}", va="center", fontsize=9)
    ax.set_xlabel("training samples / second (higher is better)")
    ax.set_xlim(0, table["samples/s"].max() * 1.35)
    ax.set_title("Same DLRM, same data, same global batch")
    plt.tight_layout()
    return ax
