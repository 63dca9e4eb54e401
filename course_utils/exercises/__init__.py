"""Checkers for the "build it" exercises: the learner writes the function, a checker runs it.

Each ``check_<name>(fn)`` runs the learner's ``fn`` (on real gloo ranks where it communicates)
against torch's engine or the course's reference, prints one line ``passed: ...`` saying what
was checked, or ``not yet: ...`` and what differs in plain words, and returns a ``CheckResult``
(true when passed). ``check_<name>_many(fns)`` checks several in one launch and prints nothing.
``solutions`` holds one worked solution per exercise.

- ``ring``: chapter 02, ``ring_all_reduce(tensor)`` against ``dist.all_reduce``;
- ``gradient_sync``: chapter 04, ``bucketed_gradient_sync(model, bucket_bytes)`` against torch's DDP;
- ``data_position``: chapter 08, a sampler's ``state_dict`` / ``load_state_dict`` against
  ``checkpoint.ResumableSampler``;
- ``row_wise``: chapter 07, ``row_wise_lookup(local_rows, ids, offsets, num_embeddings)`` against
  ``F.embedding_bag`` on the full table;
- ``one_f_one_b``: chapter 06, ``one_f_one_b_order(stages, microbatches)`` against the course's
  1F1B schedule (no ranks);
- ``tensor_parallel``: chapter 05, ``tensor_parallel_mlp(x, ...)`` (the Megatron-LM MLP's forward)
  against the same MLP unsharded;
- ``data_parallel``: chapter 03, ``data_parallel_loss(model, inputs, targets, devices)`` (one
  DataParallel step by hand) against the same batch on one device (no ranks).

Taught in chapters 02, 03, 04, 05, 06, 07 and 08 (their "build it" exercises).
"""

from course_utils.exercises import solutions
from course_utils.exercises.data_parallel import check_data_parallel_loss, check_data_parallel_loss_many
from course_utils.exercises.data_position import check_resumable_sampler, check_resumable_sampler_many
from course_utils.exercises.gradient_sync import (
    check_bucketed_gradient_sync,
    check_bucketed_gradient_sync_many,
)
from course_utils.exercises.one_f_one_b import check_one_f_one_b_order, check_one_f_one_b_order_many
from course_utils.exercises.result import CheckResult
from course_utils.exercises.ring import check_ring_all_reduce, check_ring_all_reduce_many
from course_utils.exercises.row_wise import check_row_wise_lookup, check_row_wise_lookup_many
from course_utils.exercises.tensor_parallel import check_tensor_parallel_mlp, check_tensor_parallel_mlp_many

__all__ = [
    "CheckResult",
    "solutions",
    "check_ring_all_reduce",
    "check_ring_all_reduce_many",
    "check_bucketed_gradient_sync",
    "check_bucketed_gradient_sync_many",
    "check_resumable_sampler",
    "check_resumable_sampler_many",
    "check_row_wise_lookup",
    "check_row_wise_lookup_many",
    "check_one_f_one_b_order",
    "check_one_f_one_b_order_many",
    "check_tensor_parallel_mlp",
    "check_tensor_parallel_mlp_many",
    "check_data_parallel_loss",
    "check_data_parallel_loss_many",
]
