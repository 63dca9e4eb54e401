"""The same model and batch through PyTorch's engine, ``torch.distributed.pipelining``.

Each process wraps its stage(s) of ``MLPConfig.stages(p * v)`` in a
``PipelineStage`` and hands them to a schedule class; ``schedule.step(x)`` on
the first stage's process, ``step(target=y, losses=[...])`` on the last one's,
runs one training step over ``m`` micro-batches. ``loss_fn`` is applied per
micro-batch and the gradients are divided by ``m`` (``scale_grads=True``), so
the loss is the mean of the micro-batch losses and the gradients equal the
unpipelined model's, and the hand-written executor's.

``compare_with_torch(schedule)`` runs our executor and torch's matching
schedule in the same processes, a step of each in turn, so that both see the
same machine; with ``cluster=`` both run on the modeled cluster, in its virtual
time, and each step comes with the cluster's timeline (``MeasuredRun.cluster_timeline``).

Taught in chapter 06's appendix 06a (section 6, the executor against torch.distributed.pipelining).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import pipelining
from torch.distributed.pipelining import PipelineStage

from course_utils.pipeline.executor import ScheduleRunner
from course_utils.pipeline.mlp import MLPConfig, loss_fn
from course_utils.pipeline.runs import MeasuredRun, PipelineRun, alternate, check_runnable, collect
from course_utils.pipeline.schedules import SCHEDULE_KINDS, Schedule, ScheduleKind
from course_utils.runtime import cluster
from course_utils.runtime.hardware import rank_device
from course_utils.runtime.launcher import launch
from course_utils.runtime.timing import now
from course_utils.runtime.versions import fix_init_handshake, step_accepts_return_outputs

# kind -> torch's schedule class, for the kinds torch has (from the one table, ``SCHEDULE_KINDS``)
TORCH_SCHEDULES = {
    kind: getattr(pipelining, info.torch_class) for kind, info in SCHEDULE_KINDS.items() if info.torch_class
}


class Stage(PipelineStage):
    """``PipelineStage`` whose first handshake with its neighbours sends float32 both ways
    (torch 2.9 sends an int64 into a float32 buffer, which gloo aborts on: see ``versions``).
    Newer torch (2.15) has no such handshake, and this class then adds nothing."""

    if hasattr(PipelineStage, "_get_init_p2p_neighbors_ops"):

        def _get_init_p2p_neighbors_ops(self):
            return fix_init_handshake(super()._get_init_p2p_neighbors_ops())


class TorchRunner:
    """This process's stage(s) in torch's schedule ``kind`` (a ``ScheduleKind`` or its value);
    ``step()`` and ``result()`` as for the executor's ``ScheduleRunner``."""

    def __init__(self, kind: str, p: int, m: int, v: int, config: MLPConfig, device: torch.device):
        rank, num_stages = dist.get_rank(), p * v
        modules = config.stages(num_stages)
        self.mine = [modules[n].to(device) for n in range(rank, num_stages, p)]
        stages = [
            Stage(module, n, num_stages, device)
            for module, n in zip(self.mine, range(rank, num_stages, p), strict=False)
        ]
        cls = TORCH_SCHEDULES[kind]
        self.schedule = (
            cls(stages, m, loss_fn=loss_fn)
            if kind == "interleaved_1f1b"
            else cls(stages[0], m, loss_fn=loss_fn)
        )
        # the last stage's outputs are not needed (the losses are); a step without this option keeps them
        self.options = {"return_outputs": False} if step_accepts_return_outputs(self.schedule) else {}
        self.holds_first, self.holds_last = rank == 0, rank == (num_stages - 1) % p
        x, y = config.data()
        self.x, self.y, self.device = x.to(device), y.to(device), device
        self.times, self.losses, self.windows = [], [], []

    def step(self) -> None:
        for module in self.mine:
            module.zero_grad(set_to_none=True)
        self.losses = []
        args = (self.x,) if self.holds_first else ()
        kwargs = {"target": self.y, "losses": self.losses} if self.holds_last else {}
        dist.barrier()
        start, start_ns = now(), cluster.modeled_ns() if cluster.installed() is not None else 0
        self.schedule.step(*args, **self.options, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append((now() - start) * 1e3)
        if cluster.installed() is not None:  # the step's stretch of this rank's modeled timeline
            self.windows.append((start_ns, cluster.modeled_ns()))

    def result(self) -> dict:
        """As ``ScheduleRunner.result`` (without events): each micro-batch loss / m, a share of the mean."""
        return {
            "times": self.times,
            "losses": [loss.item() / len(self.losses) for loss in self.losses],
            "grads": {name: p.grad.cpu() for module in self.mine for name, p in module.named_parameters()},
            "windows": self.windows,
            "timeline": cluster.timeline() if cluster.installed() is not None else None,
        }


def torch_pipeline_rank(
    kind: str, p: int, m: int, v: int, config: MLPConfig, steps: int, schedule: Schedule | None = None
) -> list[dict]:
    """What each process runs (under ``launch``): ``steps`` steps of torch's schedule
    ``kind``, alternating with our executor's ``schedule`` if one is given."""
    device = rank_device()  # its GPU under NCCL, else (and on a modeled cluster) the CPU
    runners = [TorchRunner(kind, p, m, v, config, device)]
    if schedule is not None:
        runners.append(ScheduleRunner(schedule, config, device))
    return alternate(runners, steps)


def run_torch_pipeline(
    kind: ScheduleKind | str,
    p: int,
    m: int,
    config: MLPConfig = MLPConfig(),
    v: int = 1,
    steps: int = 3,
    warmup: int = 1,
    timeout: float = 120.0,
    cluster=None,
) -> MeasuredRun:
    """Run torch's ``kind`` schedule on ``p`` processes: a ``ScheduleKind`` or its value, "gpipe",
    "1f1b" or "interleaved_1f1b" (with ``v`` stages per process); ``warmup`` untimed steps, then
    ``steps`` timed (on the modeled ``cluster``, if given)."""
    if kind not in TORCH_SCHEDULES:
        raise ValueError(f"unknown schedule {str(kind)!r}; choose one of {[str(k) for k in TORCH_SCHEDULES]}")
    kind = ScheduleKind(kind)
    if (kind == ScheduleKind.INTERLEAVED_1F1B) != (v > 1):
        raise ValueError(
            f"v > 1 (stages per process) goes with 'interleaved_1f1b' only; got {str(kind)!r}, v={v}"
        )
    config.stages(p * v)
    config.microbatches(m)
    results = launch(
        torch_pipeline_rank,
        kind,
        p,
        m,
        v,
        config,
        warmup + steps,
        world_size=p,
        timeout=timeout,
        show_output=False,
        cluster=cluster,
    )
    return collect([r[0] for r in results], warmup)


def compare_with_torch(
    schedule: Schedule,
    config: MLPConfig = MLPConfig(),
    steps: int = 3,
    warmup: int = 1,
    timeout: float = 120.0,
    cluster=None,
) -> tuple[PipelineRun, MeasuredRun]:
    """Our executor's ``schedule`` and torch's matching schedule class, a step of each in
    turn on the same processes (ranks of the modeled ``cluster``, if given): (our PipelineRun,
    torch's MeasuredRun)."""
    if schedule.kind not in TORCH_SCHEDULES:
        raise ValueError(
            f"no torch schedule is compared with {schedule.name!r}; "
            f"choose one of {[kind.title for kind in TORCH_SCHEDULES]}"
        )
    check_runnable(schedule, config, steps, warmup)
    results = launch(
        torch_pipeline_rank,
        schedule.kind,
        schedule.p,
        schedule.m,
        schedule.v,
        config,
        warmup + steps,
        schedule,
        world_size=schedule.p,
        timeout=timeout,
        show_output=False,
        cluster=cluster,
    )
    return collect([r[1] for r in results], warmup, schedule), collect([r[0] for r in results], warmup)
