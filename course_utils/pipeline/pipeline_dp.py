"""Pipeline + data parallel: ``copies`` pipelines of ``stages`` ranks train one model together.

    ranks  = copies x stages       rank r: copy c = r // stages, stage s = r % stages
    pipeline of copy c: ranks [c*stages, .., c*stages + stages-1]   (1F1B among them)
    copies of stage s:  ranks [s, s+stages, ..]                     (all_reduce among them)

Copy ``c`` trains on its ``1/copies`` share of the rows of the global batch, cut into
``m`` micro-batches, with ``plain.train_step_1f1b``; after the flush each stage's copies
average their gradients and step. Each copy's loss is the mean over its rows, so the
average over copies is the mean over the global batch: the steps are those of one
process training the whole model on the whole batch (``train_one_process``), which
``run_pipeline_training`` lets you compare. With ``copies=1`` it is plain 1F1B.

Taught in chapter 06 (section 10, pipeline + data parallel).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils.pipeline.mlp import MLPConfig, loss_fn
from course_utils.pipeline.plain import train_step_1f1b
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.launcher import launch

__all__ = ["pipeline_dp_rank", "run_pipeline_training", "train_one_process"]


def _optimizer(params, lr: float):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def pipeline_dp_rank(config: MLPConfig, stages: int, copies: int, m: int, steps: int, lr: float) -> dict:
    """What rank r runs (under ``launch``): its stage, its pipeline and its copies' group,
    ``steps`` training steps. Returns its losses (last stage), first-step gradients and final
    parameters, by name."""
    rank = dist.get_rank()
    copy, s = divmod(rank, stages)
    # every rank creates every stage's group of copies, in the same order
    groups = [dist.new_group(list(range(t, stages * copies, stages))) for t in range(stages)]
    device = rank_device()  # under NCCL this rank's GPU, else the CPU
    stage = config.stages(stages)[s].to(device)
    optimizer = _optimizer(stage.parameters(), lr)
    x, y = (t.to(device) for t in config.data())
    rows = slice(copy * config.batch // copies, (copy + 1) * config.batch // copies)
    xs, ys = x[rows].chunk(m), y[rows].chunk(m)
    ranks = list(range(copy * stages, (copy + 1) * stages))
    losses, first_grads = [], None
    for _ in range(steps):
        losses.append(train_step_1f1b(stage, optimizer, xs, ys, ranks, groups[s] if copies > 1 else None))
        if first_grads is None:
            first_grads = {n: q.grad.clone() for n, q in stage.named_parameters()}
    params = {n: q.detach().clone() for n, q in stage.named_parameters()}
    return {"copy": copy, "stage": s, "losses": losses, "grads": first_grads, "params": params}


def run_pipeline_training(
    config: MLPConfig,
    stages: int = 2,
    copies: int = 1,
    m: int = 4,
    steps: int = 3,
    lr: float = 0.1,
    timeout: float = 120.0,
) -> dict:
    """Train on ``copies x stages`` processes; return the final parameters by name (copy 0's,
    after checking every copy holds the same), copy 0's first-step gradients, and per step the
    loss averaged over the copies."""
    if config.batch % (copies * m):
        raise ValueError(
            f"batch {config.batch} cannot be cut into {copies} copies x {m} micro-batches: "
            f"choose a batch that is a multiple of {copies * m}"
        )
    config.stages(stages)  # clear error before any process starts
    results = launch(
        pipeline_dp_rank, config, stages, copies, m, steps, lr,
        world_size=stages * copies, timeout=timeout, show_output=False,
    )  # fmt: skip
    for r in results:
        for name, value in r["params"].items():
            mine = next(q for q in results if q["copy"] == 0 and q["stage"] == r["stage"])["params"][name]
            if not torch.equal(value, mine):
                raise AssertionError(f"copy {r['copy']} of stage {r['stage']} drifted from copy 0 at {name}")
    copy0 = [r for r in results if r["copy"] == 0]
    last = [r for r in results if r["stage"] == stages - 1]
    return {
        "params": {n: q for r in copy0 for n, q in r["params"].items()},
        "grads": {n: g for r in copy0 for n, g in r["grads"].items()},
        "losses": [sum(r["losses"][k] for r in last) / copies for k in range(steps)],
    }


def train_one_process(config: MLPConfig, steps: int = 3, lr: float = 0.1) -> dict:
    """The same training in this process: the whole model, the whole batch at once."""
    model = config.build()
    optimizer = _optimizer(model.parameters(), lr)
    x, y = config.data()
    losses, first_grads = [], None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if first_grads is None:
            first_grads = {n: q.grad.clone() for n, q in model.named_parameters()}
    params = {n: q.detach().clone() for n, q in model.named_parameters()}
    return {"params": params, "grads": first_grads, "losses": losses}
