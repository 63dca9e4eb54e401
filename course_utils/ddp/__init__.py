"""DistributedDataParallel by hand, next to PyTorch's, with one shared training loop.

* ``naive``: ``NaiveDDP``, all-reduce every gradient after backward.
* ``bucketed``: ``BucketedDDP``, buckets all-reduced asynchronously from gradient
  hooks while backward runs, and ``no_sync`` for gradient accumulation.
* ``train``: ``ddp_worker`` (one rank; naive, bucketed or torch DDP) and
  ``train_single`` (one process on the global batch), same data, seeds and loop
  (``course_utils.train.fit``).
* ``compare``: single process vs DataParallel vs DDP on the same model and data.
"""
from .bucketed import Bucket, BucketedDDP, make_buckets
from .naive import NaiveDDP, broadcast_parameters
from .train import (KINDS, TrainSettings, ddp_worker, finish_gradient_sync, global_batches, global_loader,
                    max_difference, rank_batches, rank_loader, sampler_indices, train_single, wrap)

__all__ = ["NaiveDDP", "BucketedDDP", "Bucket", "make_buckets", "broadcast_parameters", "KINDS", "TrainSettings",
           "ddp_worker", "train_single", "wrap", "finish_gradient_sync", "sampler_indices", "rank_loader",
           "global_loader", "rank_batches", "global_batches", "max_difference"]
