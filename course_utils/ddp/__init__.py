"""DistributedDataParallel by hand, next to PyTorch's, with one shared training loop.

* ``naive``: ``NaiveDDP``, all-reduce every gradient after backward.
* ``bucketed``: ``BucketedDDP``, buckets all-reduced asynchronously from gradient
  hooks while backward runs, and ``no_sync`` for gradient accumulation; and
  ``settle_ddp_buckets`` for torch's DDP (its buckets rebuilt before the first step).
* ``train``: ``ddp_worker`` (one rank; naive, bucketed or torch DDP) and
  ``train_single`` (one process on the global batch), same data, seeds and loop
  (``course_utils.workload.train.fit``); ``rank_loader`` / ``global_loader`` stream their batches.
* ``overlap``: a DDP step timed on a modeled GPU cluster (virtual time): what backward hides, the
  bucket size; ``plot`` draws it; ``runs``: DDP against one GPU (``scaling``), and single process vs
  DataParallel vs DDP on the same model and data.

For appendices 04a and 04b, one module per practice, imported by name (``from course_utils.ddp import
mixed_precision``): ``in_backward`` (the sync inside ``backward()``, ``no_sync``'s placement),
``mixed_precision`` (autocast, a loss scaler with ``no_sync``, clipping after the sync),
``rank_agreement`` (seeds and gradient norms across ranks), ``comm_hooks`` (fp16/bf16 and PowerSGD,
their bytes), ``sparse_tables`` (sparse embedding gradients under DDP), ``evaluation`` (the exact
AUC across ranks), ``input_pipeline`` (a rank's DataLoader for a GPU), ``options``, ``uneven``, and
``published`` (PyTorch's own DDP benchmark, modeled at real size against its published times).

Taught in chapter 04 and its appendices 04a and 04b (chapter 03's threads against processes:
``course_utils.data_parallel.gil``).
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
