"""What chapter 04 measures: DDP against one GPU, and single process vs DataParallel vs DDP.

``scaling`` times PyTorch's DDP on 1, 2, 4 and 8 modeled GPUs (a modeled cluster, virtual time:
``overlap.step_profile``), each GPU keeping its own rows: how close w GPUs come to w times one.

``compare_single_dp_ddp`` trains the same DLRM on the same data with the same
global batches four ways and returns one row per way: samples/s, wall time, CPU
time of the busiest process, and the AUC and log loss the model reaches;
``plot_comparison`` draws the CPU time (the wall time of two shared CPU cores says nothing
about GPUs).

Taught in chapter 04 (section 5b, DDP against one GPU; appendix 04b, section 4, single process vs
DataParallel vs DDP).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from course_utils.data_parallel import DataParallelByHand
from course_utils.data_parallel.gil import one_torch_thread
from course_utils.ddp.overlap import MLPERF_DLRM, step_profile
from course_utils.ddp.train import TrainSettings, ddp_worker, train_single
from course_utils.runtime.hardware import devices
from course_utils.runtime.launcher import launch
from course_utils.workload.data import ClickLogs
from course_utils.workload.models import DLRMConfig

__all__ = ["scaling", "compare_single_dp_ddp", "plot_comparison"]


def scaling(sizes=(1, 2, 4, 8), config: DLRMConfig = MLPERF_DLRM, rows: int = 512) -> dict:
    """On every rank of ``launch(..., world_size=max(sizes), cluster=...)``: PyTorch's DDP against one
    GPU. For each ``w`` of ``sizes``, the first ``w`` ranks train the DLRM ``config`` on ``rows`` rows
    each (``overlap.step_profile``): ``w = 1`` the bare model (one GPU, no DDP), else PyTorch's DDP
    on a group of those ranks. One launch for every size; each size's steps run after the last's.
    Returns, on rank 0, ``{w: step_profile's figures}``; ``{}`` on the other ranks."""
    me, out = dist.get_rank(), {}
    groups = {w: dist.new_group(list(range(w))) for w in sizes if w > 1}  # every rank creates every group
    for w in sizes:
        if me < w:
            kind = ("none", {}) if w == 1 else ("torch", {})
            out[w] = step_profile({"step": kind}, config, rows, group=groups.get(w))["step"]
        dist.barrier()
    return out if me == 0 else {}


def _data_parallel(model: nn.Module) -> nn.Module:
    devs = devices(2, quiet=True)  # two GPUs when there are, else CPU stand-ins
    return DataParallelByHand(model.to(devs[0]), devs)


def compare_single_dp_ddp(
    train: ClickLogs, test: ClickLogs, model_config: DLRMConfig, settings: TrainSettings, timeout: float = 300
):
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
        runs = {
            "single process": [train_single(train, model_config, settings, 2, test, live=False)],
            "DataParallel by hand (2 threads)": [
                train_single(train, model_config, settings, 2, test, parallel=_data_parallel, live=False)
            ],
        }
        for name, kind in (("DDP by hand (2 processes)", "bucketed"), ("torch DDP (2 processes)", "torch")):
            runs[name] = launch(
                ddp_worker,
                kind,
                train,
                model_config,
                settings,
                test,
                world_size=2,
                timeout=timeout,
                show_output=False,
            )
    table = pd.DataFrame(
        {
            name: {
                "samples/s": r[0].samples_per_s,
                "wall s": r[0].seconds,
                "CPU s busiest": max(x.cpu_seconds for x in r),
                "AUC": r[0].final["auc"],
                "logloss": r[0].final["logloss"],
                "steps": len(r[0].step_loss),
            }
            for name, r in runs.items()
        }
    ).T
    table["steps"] = table["steps"].astype(int)
    return table


def plot_comparison(table, ax=None):
    """Bar chart of ``CPU s busiest`` per way of training (this machine's CPU seconds), with each
    bar's AUC written on it."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3), dpi=90)
    colours = ["#888888", "#d98c3f", "#3f7fd9", "#2a5599"][: len(table)]
    column = table["CPU s busiest"]
    bars = ax.barh(table.index[::-1], column[::-1], color=colours[::-1])
    for bar, auc in zip(bars, table["AUC"][::-1], strict=False):
        ax.text(
            bar.get_width(), bar.get_y() + bar.get_height() / 2, f"  AUC {auc:.3f}", va="center", fontsize=9
        )
    ax.set_xlabel("CPU seconds of the busiest process, this machine (lower: the work is spread)")
    ax.set_xlim(0, column.max() * 1.35)
    ax.set_title("Same DLRM, same data, same global batch")
    plt.tight_layout()
    return ax
