"""The AUC of predictions spread over ranks, computed exactly: gather them, then rank them once.

Each rank scores its own share of the evaluation rows. The loss can be averaged over the
ranks (a mean of equal-sized means is the mean), but the AUC cannot: it is the share of
(click, non-click) *pairs* ordered correctly, and most pairs have their two rows on
different ranks. The mean of the ranks' own AUCs leaves those pairs out, and it weighs a
rank with few clicks like one with many (``tests/test_global_auc.py`` shows the two apart).

Two exact ways exist: gather every ``(label, score)`` pair and rank them once (done here:
16 bytes a row, so an evaluation set of ten million rows moves 160 MB once per evaluation),
or count exactly per distinct score (a sort-merge over ranks). Libraries that bin the scores
into a fixed number of thresholds (``torchmetrics``' ``thresholds=``, TorchRec's windowed AUC)
trade that exactness for a fixed size.

Taught in chapter 08 (the production job logs it) and chapter 04 (evaluating data-parallel training).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from course_utils.runtime.hardware import rank_device
from course_utils.workload.metrics import auc

__all__ = ["gather_predictions", "distributed_auc"]


def gather_predictions(labels, scores, group=None) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's ``labels [n_r]`` (0/1) and ``scores [n_r]``, concatenated in rank order:
    ``(labels [N], scores [N])`` as float64 numpy arrays, the same on every rank of ``group``.
    The ranks may hold different numbers of rows (zero included)."""
    device = rank_device()  # NCCL gathers CUDA tensors only
    columns = [np.array(x, dtype=np.float64).reshape(-1) for x in (labels, scores)]  # copies: writable
    mine = torch.from_numpy(np.stack(columns))  # [2, n_r]
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.shape[1]], device=device), group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(2, longest, dtype=torch.float64, device=device)
    padded[:, : mine.shape[1]] = mine
    everyone = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(everyone, padded, group=group)
    both = torch.cat([part[:, : int(n)] for part, n in zip(everyone, sizes, strict=True)], dim=1)
    return both[0].cpu().numpy(), both[1].cpu().numpy()


def distributed_auc(labels, scores, group=None) -> float:
    """The exact AUC of all ranks' predictions together (:func:`gather_predictions`, then
    ``metrics.auc``): every rank of ``group`` calls it and gets the same number.
    ``labels [n_r]``, ``scores [n_r]``: this rank's rows."""
    all_labels, all_scores = gather_predictions(labels, scores, group)
    return auc(all_labels, all_scores)
