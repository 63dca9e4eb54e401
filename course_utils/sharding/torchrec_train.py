"""Train the TorchRec twin (``torchrec_dlrm``) beside the course's hybrid DLRM, on the same data.

    train_torchrec(model, optimizer, data, batch_size)   every rank: the global batches train_hybrid
        trains on (InMemoryBatches with seed + epoch, each rank its rows: local_rows), through
        TrainPipelineSparseDist or a plain loop; returns the step losses (mean over the ranks)
    evaluate_torchrec(model, data)       AUC and logloss over all of data; every rank the same
    train_and_test(train, test, options) every rank: the twin of DLRM(seed), trained and tested
    compare(train, test, options)        every rank: that, then HybridDLRM from the same start
    gradient_scale(batch, lr, divide)    every rank: how far one SGD step moves each table,
                                         TorchRec (its gradient division on or off) over HybridDLRM
    run_comparison, run_gradient_scale   the launches, from a notebook or a test

The checkpoint and the resume: ``torchrec_checkpoint``.

Taught in chapter 07 (appendix 07a, TorchRec).
"""

from __future__ import annotations

import time
from itertools import islice

import torch
import torch.distributed as dist

from course_utils.runtime.launcher import launch
from course_utils.sharding.hybrid import HybridDLRM, evaluate_hybrid, local_rows, train_hybrid
from course_utils.sharding.torchrec_dlrm import (
    TABLES,
    describe_plan,
    require_torchrec,
    shard,
    table_index,
    to_torchrec_batch,
)
from course_utils.workload.data import ClickLogs
from course_utils.workload.data.loaders import InMemoryBatches
from course_utils.workload.metrics import scores
from course_utils.workload.models import DLRM

__all__ = [
    "train_torchrec",
    "evaluate_torchrec",
    "DEFAULTS",
    "build",
    "with_defaults",
    "train_and_test",
    "compare",
    "gradient_scale",
    "run_comparison",
    "run_gradient_scale",
]


def train_torchrec(
    model,
    optimizer,
    data: ClickLogs,
    *,
    batch_size: int,
    seed: int = 0,
    epochs: int = 1,
    start: int = 0,
    stop: int | None = None,
    pipelined: bool = True,
) -> list[float]:
    """Steps ``[start, stop)`` of ``epochs`` epochs over ``data`` (all of them by default), in
    every rank; returns each step's loss on the global batch (the mean over the ranks).

    pipelined: ``TrainPipelineSparseDist`` (batch ``i + 1``'s ids go out while batch ``i``
    trains; on CPU it has no streams to overlap them on) or the plain loop: zero_grad, forward,
    backward (which updates the tables), ``optimizer.step()`` (the dense layers).
    """
    # details: imports, and a batch every rank gets an equal share of
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    rank, world = dist.get_rank(), dist.get_world_size()
    if batch_size % world or len(data) % batch_size % world:
        raise ValueError(
            f"batches of {batch_size} rows from {len(data)} rows cannot be split equally over {world} "
            f"ranks; use a batch size and a number of rows that are multiples of {world}"
        )
    # end details
    loader = InMemoryBatches(data, batch_size, seed)

    def every_step():
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            yield from loader

    shares = (to_torchrec_batch(local_rows(b, rank, world)) for b in islice(every_step(), start, stop))
    model.train()
    losses = []
    if pipelined:
        pipeline = TrainPipelineSparseDist(model, optimizer, torch.device("cpu"))
        while True:
            try:
                loss, _ = pipeline.progress(shares)
            except StopIteration:
                break
            losses.append(float(loss))
        pipeline.detach()  # the model's own forward back, for evaluation
    else:
        for batch in shares:
            optimizer.zero_grad()
            loss, _ = model(batch)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    total = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(total)
    return (total / world).tolist()


@torch.no_grad()
def evaluate_torchrec(model, data: ClickLogs, batch_size: int = 8192) -> dict:
    """``{"auc", "logloss"}`` over all of ``data``: each rank predicts its contiguous share (as
    ``evaluate_hybrid`` does), the predictions are gathered. ``len(data)`` must divide by ``W``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(data) % world:
        raise ValueError(f"{len(data)} evaluation rows cannot be split equally over {world} ranks")
    share = len(data) // world
    model.eval()
    logits = [
        model(to_torchrec_batch(b))[1][1]
        for b in data[rank * share : (rank + 1) * share].batches(max(batch_size // world, 1))
    ]
    model.train()
    mine = torch.sigmoid(torch.cat(logits)).double()
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    return scores(data.label, torch.cat(everyone).numpy())


#: What ``compare``, ``train_and_test`` and ``resume_run`` take (``options``), and their defaults.
DEFAULTS = {
    "kind": "table_wise",  # or "column_wise": what TorchRec and the course both shard on CPU
    "optimizer": "adagrad",  # TorchRec's fused one (FUSED_OPTIMIZERS); the course's is torch's Adagrad
    "lr": 0.02,
    "eps": 1e-10,  # torch.optim.Adagrad's default (FBGEMM's is 1e-8)
    "batch_size": 1024,  # global batch, rows
    "seed": 0,  # the DLRM both start from
    "pipelined": True,  # TrainPipelineSparseDist, or the plain loop
}


def with_defaults(options: dict) -> dict:
    """``DEFAULTS`` updated with ``options``; an unknown option is a ``ValueError``."""
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; the options are {sorted(DEFAULTS)}")
    return DEFAULTS | options


def build(data: ClickLogs, o: dict, seed: int):
    """``shard`` of ``DLRM(data.cardinalities, seed=seed)`` with the options ``o``."""
    return shard(
        DLRM(data.cardinalities, seed=seed),
        o["kind"],
        optimizer=o["optimizer"],
        lr=o["lr"],
        eps=o["eps"],
        batch_per_rank=o["batch_size"] // dist.get_world_size(),
    )


def train_and_test(train: ClickLogs, test: ClickLogs, options: dict) -> dict:
    """In every rank: the TorchRec twin of ``DLRM(seed)`` trained one epoch on ``train``, tested on
    ``test``. Returns ``{"plan": [lines], "step_loss", "seconds" (training), "auc", "logloss"}``."""
    o = with_defaults(options)
    model, optimizer, plan = build(train, o, o["seed"])
    began = time.perf_counter()
    losses = train_torchrec(model, optimizer, train, batch_size=o["batch_size"], pipelined=o["pipelined"])
    out = {"plan": describe_plan(plan), "step_loss": losses, "seconds": time.perf_counter() - began}
    return out | evaluate_torchrec(model, test)


def compare(train: ClickLogs, test: ClickLogs, options: dict) -> dict:
    """In every rank: ``train_and_test`` for TorchRec, then the course's ``HybridDLRM`` of the same
    ``DLRM(seed)`` and ``kind``, trained by ``train_hybrid`` on the same global batches with
    ``torch.optim.Adagrad`` (same ``lr`` and ``eps``) and tested by ``evaluate_hybrid``.
    Returns ``{"torchrec": {...}, "hybrid": {"step_loss", "seconds", "auc", "logloss"}}``."""
    o = with_defaults(options)
    torchrec_side = train_and_test(train, test, o)
    hybrid = HybridDLRM(DLRM(train.cardinalities, seed=o["seed"]), o["kind"])
    adagrad = torch.optim.Adagrad(hybrid.parameters(), lr=o["lr"], eps=o["eps"])
    history = train_hybrid(hybrid, train, batch_size=o["batch_size"], optimizer=adagrad)
    hybrid_side = {"step_loss": history.step_loss, "seconds": history.seconds}
    return {"torchrec": torchrec_side, "hybrid": hybrid_side | evaluate_hybrid(hybrid, test)}


def _moved(pieces, n_tables: int) -> torch.Tensor:
    """``[T]``: over all ranks, the largest ``|after - before|`` of each table (``pieces``: this
    rank's ``(table, after, before)``)."""
    out = torch.zeros(n_tables)
    for table, after, before in pieces:
        out[table] = max(out[table].item(), (after - before).abs().max().item())
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def gradient_scale(batch: ClickLogs, lr: float, divide: bool) -> list[float]:
    """In every rank: one SGD step on ``batch`` (the global batch) with TorchRec (fused ``EXACT_SGD``;
    ``comm_ops.set_gradient_division(divide)``) and with ``HybridDLRM`` (its hook divides by ``W``),
    from the same weights; returns, per table, how far TorchRec moved it over how far the course did."""
    from torchrec.distributed import comm_ops

    comm_ops.set_gradient_division(divide)
    start = DLRM(batch.cardinalities, seed=0)
    model, optimizer, _ = shard(DLRM(batch.cardinalities, seed=0), optimizer="sgd", lr=lr)
    train_torchrec(model, optimizer, batch, batch_size=len(batch), pipelined=False)
    theirs = [  # whole tables here (table-wise)
        (table_index(key), piece.tensor, start.embeddings[table_index(key)].weight)
        for key, value in model.state_dict().items()
        if key.startswith(TABLES)
        for piece in value.local_shards()
    ]
    hybrid = HybridDLRM(DLRM(batch.cardinalities, seed=0), "table_wise")
    train_hybrid(hybrid, batch, batch_size=len(batch), lr=lr, optimizer="sgd")
    ours = [
        (s.table, w.detach(), s.of(start.embeddings[s.table].weight))
        for s, w in zip(hybrid.embeddings.shards, hybrid.embeddings.weights, strict=True)
    ]
    n = len(batch.cardinalities)
    return (_moved(theirs, n) / _moved(ours, n)).tolist()


def run_comparison(train: ClickLogs, test: ClickLogs, world_size: int = 2, timeout: float = 300, **options):
    """:func:`compare` on ``world_size`` CPU ranks (gloo); returns rank 0's result (every rank
    computes the same metrics)."""
    require_torchrec()
    options = with_defaults(options)
    return launch(compare, train, test, options, world_size=world_size, backend="gloo", timeout=timeout)[0]


def run_gradient_scale(batch: ClickLogs, lr: float = 0.5, world_size: int = 2, timeout: float = 300) -> dict:
    """:func:`gradient_scale` with TorchRec's division on and off: ``{True: ratios, False: ratios}``."""
    require_torchrec()
    return {
        divide: launch(
            gradient_scale,
            batch,
            lr,
            divide,
            world_size=world_size,
            backend="gloo",
            timeout=timeout,
            show_output=False,
        )[0]
        for divide in (True, False)
    }
