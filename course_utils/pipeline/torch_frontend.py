"""torch.distributed.pipelining's front end: a model cut into stages by ``pipeline()`` at
``SplitPoint``s, or built stage by stage on the meta device, then run by torch's schedules.

    Tower(width, layers)        one module (blocks in a ModuleDict, "0", "1", ..), the model to cut
    split_by_tracing(...)       ``pipeline(model, mb_args, split_spec)``: torch.export traces the
                                forward once and cuts it where ``SplitPoint.BEGINNING`` says
    stage_on_meta(...)          torchtitan's way: build the model on the "meta" device (shapes,
                                no memory), delete the blocks of other stages, materialise the
                                rest (``to_empty``) and initialise them
    run_frontend(config, m)     on 2 processes: 1F1B over the traced split (with ``scale_grads``
                                True, then False), the interleaved zero-bubble schedule over
                                meta-built stages; the losses and every gradient, to compare
                                with one process (``tower_reference``)

``scale_grads``: each micro-batch's loss is ``loss_fn`` of its rows (a mean), and backward adds
the m micro-batches' gradients into ``.grad``; with ``scale_grads=True`` (the default) the
schedule divides them by m once the step's backwards are done (``PipelineStage.scale_grads``),
so they are those of the mean over the whole batch; with ``False`` they stay m times larger, as
a summed loss wants. The losses handed back (``losses=[...]``) are each micro-batch's own.

Weights are made per block from ``seed`` and the block's index, so a stage that builds only its
blocks gets the same weights as the whole model.

Taught in chapter 06 (section 11, the same with ``torch.distributed.pipelining``).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining
from torch.distributed.pipelining import SplitPoint, pipeline

from course_utils.pipeline.mlp import MLPConfig, loss_fn
from course_utils.pipeline.torch_pipelining import Stage
from course_utils.runtime.hardware import devices
from course_utils.runtime.launcher import launch

__all__ = ["Tower", "split_by_tracing", "stage_on_meta", "frontend_rank", "run_frontend", "tower_reference"]


class Tower(nn.Module):
    """``layers`` blocks ``Linear(width, width) + ReLU``; ``x [b, width] -> [b, width]``.
    ``blocks`` is a ModuleDict so that a stage can delete the blocks it does not hold."""

    def __init__(self, width: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): nn.Linear(width, width) for i in range(layers)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x

    @torch.no_grad()
    def init_weights(self, seed: int) -> Tower:
        """Each block's weights from ``seed`` and its own index, uniform in +-1/sqrt(width)."""
        for name, block in self.blocks.items():
            gen = torch.Generator().manual_seed(seed * 1000 + int(name))
            bound = block.in_features**-0.5
            for param in (block.weight, block.bias):
                param.copy_(torch.rand(param.shape, generator=gen) * 2 * bound - bound)
        return self


def split_by_tracing(config: MLPConfig, num_stages: int, m: int) -> pipelining.Pipe:
    """The whole ``Tower`` cut into ``num_stages`` stages by ``pipeline()``: a split point at the
    beginning of every ``layers / num_stages``-th block; ``mb_args``: one micro-batch, for tracing."""
    model = Tower(config.width, config.layers).init_weights(config.seed)
    x, _ = config.data()
    per = config.layers // num_stages
    split_spec = {f"blocks.{k * per}": SplitPoint.BEGINNING for k in range(1, num_stages)}
    with warnings.catch_warnings():  # torch.export's deprecation notes differ between releases
        warnings.simplefilter("ignore")
        return pipeline(model, mb_args=(x.chunk(m)[0],), split_spec=split_spec)


def stage_on_meta(config: MLPConfig, stage: int, num_stages: int, device: torch.device) -> Tower:
    """Stage ``stage`` of ``num_stages``, built without the rest: on "meta", then materialised."""
    per = config.layers // num_stages
    with torch.device("meta"):
        model = Tower(config.width, config.layers)  # shapes only: no memory, no initialisation
    for name in list(model.blocks):
        if not stage * per <= int(name) < (stage + 1) * per:
            del model.blocks[name]
    return model.to_empty(device=device).init_weights(config.seed)


def _step(schedule, rank: int, first: int, last: int, x, y) -> list:
    """One training step of ``schedule``: the input on the first stage's rank, the target on the
    last's. Returns the per-micro-batch losses (on the last stage's rank, else [])."""
    losses = []
    kwargs = {"target": y, "losses": losses} if rank == last else {}
    schedule.step(*((x,) if rank == first else ()), **kwargs)
    return [loss.item() for loss in losses]


def frontend_rank(config: MLPConfig, m: int) -> dict:
    """Under ``launch`` on 2 ranks: three steps from zeroed gradients, each returning its losses
    and this rank's gradients by the Tower's parameter names."""
    rank, p = dist.get_rank(), dist.get_world_size()
    device = devices(p, quiet=True)[rank]
    x, y = (t.to(device) for t in config.data())

    def grads(modules) -> dict:  # names as in the whole Tower: "blocks.2.weight"
        return {name: q.grad.cpu() for mod in modules for name, q in mod.named_parameters()}

    out = {}
    # 1. pipeline() + SplitPoint: stage `rank` of the traced split, run by Schedule1F1B
    pipe = split_by_tracing(config, p, m)
    for scale in (True, False):
        module = pipe.get_stage_module(rank).to(device)
        module.zero_grad(set_to_none=True)
        schedule = pipelining.Schedule1F1B(
            Stage(module, rank, p, device), m, loss_fn=loss_fn, scale_grads=scale
        )
        out["traced" if scale else "traced, scale_grads=False"] = (
            _step(schedule, rank, 0, p - 1, x, y),
            grads([module]),
        )
    # 2. meta-built stages, two per rank (rank r holds stages r and r+p), run by the interleaved ZB
    held = [rank, rank + p]
    modules = [stage_on_meta(config, n, 2 * p, device) for n in held]
    stages = [Stage(mod, n, 2 * p, device) for mod, n in zip(modules, held, strict=True)]
    schedule = pipelining.ScheduleInterleavedZeroBubble(stages, m, loss_fn=loss_fn)
    out["meta, interleaved ZB"] = (_step(schedule, rank, 0, p - 1, x, y), grads(modules))
    return out


def run_frontend(config: MLPConfig, m: int, timeout: float = 120.0) -> dict:
    """``frontend_rank`` on 2 processes: per run, (the micro-batch losses, every gradient by name)."""
    if config.layers % 4:
        raise ValueError(
            f"the interleaved run needs layers divisible by 4 (2 ranks x 2 stages), got {config.layers}"
        )
    results = launch(frontend_rank, config, m, world_size=2, timeout=timeout, show_output=False)
    return {
        name: (
            [loss for r in results for loss in r[name][0]],
            {k: g for r in results for k, g in r[name][1].items()},
        )
        for name in results[0]
    }


def tower_reference(config: MLPConfig) -> tuple[float, dict[str, torch.Tensor]]:
    """The whole Tower on the whole batch in this process: the loss and every gradient by name."""
    model = Tower(config.width, config.layers).init_weights(config.seed)
    x, y = config.data()
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item(), {name: q.grad.clone() for name, q in model.named_parameters()}
