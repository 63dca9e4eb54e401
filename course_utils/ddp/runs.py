"""What chapter 04 measures: step times of the DDP variants, and single process vs DataParallel vs DDP.

``step_times`` runs every DDP variant (naive, bucketed, torch) in turn on the same ranks,
``rounds`` times, interleaved so that each meets the same machine state, and returns each
one's step times, final weights and all-reduce count: what bucketing saves (fewer,
overlapped messages) measured.

``compare_single_dp_ddp`` trains the same DLRM on the same data with the same
global batches four ways and returns one row per way: samples/s, wall time, CPU
time of the busiest process, and the AUC and log loss the model reaches;
``plot_comparison`` draws it.

Taught in chapter 04 (section 5, buckets timed against naive and torch DDP; section 13, single
process vs DataParallel vs DDP).
"""

from __future__ import annotations

from torch import nn

from course_utils.data_parallel import DataParallelByHand
from course_utils.data_parallel.gil import one_torch_thread
from course_utils.ddp.train import TrainSettings, ddp_worker, train_single
from course_utils.runtime.hardware import devices
from course_utils.runtime.launcher import launch
from course_utils.workload.data import ClickLogs
from course_utils.workload.models import DLRMConfig

__all__ = ["VARIANTS", "step_times", "compare_single_dp_ddp", "plot_comparison"]


#: DDP variants ``step_times`` can run: name -> (kind, wrap options). "one bucket" holds every
#: gradient in a single bucket, which can only leave once backward has finished: no overlap.
VARIANTS = {
    "naive": ("naive", {}),
    "bucketed": ("bucketed", {}),
    "torch": ("torch", {}),
    "one bucket": ("bucketed", {"bucket_cap_mb": 1024.0, "first_bucket_cap_mb": 1024.0}),
}


def step_times(
    data,
    model_config: DLRMConfig,
    settings: TrainSettings,
    variants=("naive", "bucketed", "torch"),
    rounds: int = 2,
    warmup_steps: int = 2,
) -> dict:
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
    """Bar chart of ``samples/s`` per way of training, with each bar's AUC written on it."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3), dpi=90)
    colours = ["#888888", "#d98c3f", "#3f7fd9", "#2a5599"][: len(table)]
    bars = ax.barh(table.index[::-1], table["samples/s"][::-1], color=colours[::-1])
    for bar, auc in zip(bars, table["AUC"][::-1], strict=False):
        ax.text(
            bar.get_width(), bar.get_y() + bar.get_height() / 2, f"  AUC {auc:.3f}", va="center", fontsize=9
        )
    ax.set_xlabel("training samples / second (higher is better)")
    ax.set_xlim(0, table["samples/s"].max() * 1.35)
    ax.set_title("Same DLRM, same data, same global batch")
    plt.tight_layout()
    return ax
