"""Data parallelism in one process: ``nn.DataParallel`` built by hand, and why processes win.

* ``by_hand``: scatter, replicate (``Broadcast``), parallel_apply, gather and
  ``DataParallelByHand``, checked against ``nn.DataParallel``;
* ``gil``: threads against processes on the same work (``one_torch_thread``);
* ``traffic``: who sends how many bytes in one step (DataParallel by copies, with NCCL, DDP's ring).

    from course_utils.data_parallel import DataParallelByHand

Taught in chapter 03.
"""

from course_utils.data_parallel.by_hand import (
    Broadcast,
    DataParallelByHand,
    ModelWithLoss,
    chunk_sizes,
    gather,
    parallel_apply,
    replicate,
    scatter,
)

__all__ = [
    "scatter",
    "Broadcast",
    "replicate",
    "parallel_apply",
    "gather",
    "DataParallelByHand",
    "chunk_sizes",
    "ModelWithLoss",
]
