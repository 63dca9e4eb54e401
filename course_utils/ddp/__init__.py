"""DistributedDataParallel by hand, next to PyTorch's, with one shared training loop.

* ``naive``: ``NaiveDDP``, all-reduce every gradient after backward.
* ``bucketed``: ``BucketedDDP``, buckets all-reduced asynchronously from gradient
  hooks while backward runs, and ``no_sync`` for gradient accumulation; and
  ``settle_ddp_buckets`` for torch's DDP (its buckets rebuilt before the first step).
* ``train``: ``ddp_worker`` (one rank; naive, bucketed or torch DDP) and
  ``train_single`` (one process on the global batch), same data, seeds and loop
  (``course_utils.workload.train.fit``); ``rank_loader`` / ``global_loader`` stream their batches.
* ``runs``: what the chapter measures: step times of the variants, run side by side (what
  buckets save), and single process vs DataParallel vs DDP on the same model and data.

Taught in chapter 04 (chapter 03's threads against processes: ``course_utils.data_parallel.gil``).
"""

from course_utils.ddp.bucketed import Bucket, BucketedDDP, make_buckets, settle_ddp_buckets
from course_utils.ddp.naive import NaiveDDP, broadcast_parameters
from course_utils.ddp.train import (
    DDP_KINDS,
    TrainSettings,
    ddp_worker,
    finish_gradient_sync,
    global_batches,
    global_loader,
    max_difference,
    rank_batches,
    rank_loader,
    sampler_indices,
    train_single,
    wrap,
)

__all__ = [
    "NaiveDDP",
    "BucketedDDP",
    "Bucket",
    "make_buckets",
    "settle_ddp_buckets",
    "broadcast_parameters",
    "DDP_KINDS",
    "TrainSettings",
    "ddp_worker",
    "train_single",
    "wrap",
    "finish_gradient_sync",
    "sampler_indices",
    "rank_loader",
    "global_loader",
    "rank_batches",
    "global_batches",
    "max_difference",
]
