"""Run a schedule for real: one process per device, stages exchanging tensors.

Each process holds its stages of the model (stage n on device n % p) and
executes its part of ``lower(schedule)``: a compute runs F, B or W of one stage
on one micro-batch and is timed; it first waits for the tensors it receives.
On a GPU a compute is timed with CUDA events on the compute stream
(``timing.CudaSpan``): waiting for a message does not block the host there, so
a clock read around the compute would bill the wait to it.

Messages travel in batches: ``dist.batch_isend_irecv`` of ``dist.P2POp``s, as
Megatron-LM and ``torch.distributed.pipelining`` do. On NCCL a send may wait
until its receiver has posted the matching receive, and a process's messages
run one batch after another; two processes that each send before receiving
the other's message then wait forever (1F1B's steady phase does exactly that,
see ``lowering``). So every action gets a step (``action_steps``: one step per
action, as early as its device and inputs allow; every process computes the
same numbers), and both ends post a message at the step of the action that
produced it: the sender right after that compute, the receiver after its own
last compute at or before that step. All messages posted between two computes
form one batch (``batches``); the messages that cross in 1F1B's steady phase
share a step and so a batch, and every process posts its messages in the same
step order, so no two processes ever wait for each other. (Pairing each send
with the receive that follows it in the program, as Megatron-LM's 1F1B does, is
not enough for interleaved 1F1B.) A compute waits for the batch that brings its
input; sends are waited for at the end of the step.
Each message has its own tag: gloo matches messages by tag, NCCL by order,
which is the same order on both ends.

B without W (GPipe, 1F1B, interleaved) is ``autograd.backward``: input and
weight gradients together. Zero-bubble schedules split it by hand for the
``nn.Linear`` layers: B asks autograd only for dL/dx and for each Linear's
output gradient g [b, out]; W later forms dL/dW += g^T a and dL/db += sum(g)
from the saved layer input a [b, in].

``ScheduleRunner`` is one schedule on one process: its stages, workers and
program, one training step at a time. Starting the processes and measuring the
steps is ``runs.run_schedule``. Tested on gloo (CPU); NCCL (one GPU per
process) is chosen by ``launch`` when there are enough GPUs.

On a modeled cluster (``launch(..., cluster=...)``) the clock is the rank's modeled GPU
(``timing.now``), each action is a named region of its timeline (``F(0,3)``), and the
stages may live on the ``meta`` device: real sizes priced, nothing computed (no loss, no
gradients to report then).

Taught in chapter 06's appendix 06a (section 2, the executor; section 3, measured timelines).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from course_utils.pipeline.lowering import consumer_stage, lower
from course_utils.pipeline.mlp import MLPConfig, loss_fn
from course_utils.pipeline.schedules import ACTION_KINDS, Action, Schedule
from course_utils.pipeline.validate import dependencies, execution_order
from course_utils.runtime import cluster
from course_utils.runtime.timing import CudaSpan, now, synchronize


class StageWorker:
    """One stage's module and what it keeps between its F, B and W actions.

    ``saved[j]``: micro-batch j's input x [b, width], the root of its graph
    (output, or loss on the last stage) and, for split backward, each Linear's
    (module, input a, output h); after B, each Linear's (module, a, g = dL/dh).
    """

    def __init__(self, module: nn.Module, stage: int, num_stages: int, m: int, split_backward: bool):
        self.module, self.stage, self.m = module, stage, m
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.linears = [mod for mod in module.modules() if isinstance(mod, nn.Linear)]
        if split_backward:
            in_linears = {id(p) for lin in self.linears for p in lin.parameters()}
            others = [n for n, p in module.named_parameters() if id(p) not in in_linears]
            if others:
                raise ValueError(
                    f"a split backward (B, W) is written here for nn.Linear layers only; "
                    f"stage {stage} also has parameters {others[:3]}"
                )
        self.split_backward = split_backward
        self.saved: dict = {}
        self.losses: list[float] = []

    def forward(self, j: int, x: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor | None:
        """F(n,j): returns the activation to send on ([b, width]), or None on the last stage."""
        if not self.is_first:
            x.requires_grad_(True)
        records = []
        hooks = (
            [
                lin.register_forward_hook(lambda mod, inp, out: records.append((mod, inp[0], out)))
                for lin in self.linears
            ]
            if self.split_backward
            else []
        )
        out = self.module(x)
        for h in hooks:
            h.remove()
        root = loss_fn(out, target) / self.m if self.is_last else out
        if self.is_last and not root.is_meta:  # meta: shapes only, no value to read
            self.losses.append(root.item())
        self.saved[j] = (x, root, records)
        return None if self.is_last else out.detach()

    def backward(self, j: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """B(n,j): from dL/d(output) (None on the last stage) to dL/dx, to send upstream.
        Without split, weight gradients are accumulated too; with split, saved for W."""
        x, root, records = self.saved[j]
        if not self.split_backward:
            del self.saved[j]
            torch.autograd.backward(root, grad)
            return None if self.is_first else x.grad
        wanted = ([] if self.is_first else [x]) + [h for _, _, h in records]
        grads = torch.autograd.grad(root, wanted, grad)
        grad_x, grad_h = (None, grads) if self.is_first else (grads[0], grads[1:])
        self.saved[j] = [(lin, a.detach(), g) for (lin, a, _), g in zip(records, grad_h, strict=False)]
        return grad_x

    def weight(self, j: int) -> None:
        """W(n,j): weight gradients of micro-batch j from the saved inputs and output gradients."""
        for lin, a, g in self.saved.pop(j):
            for param, value in ((lin.weight, g.t() @ a), (lin.bias, g.sum(0))):
                if param is not None:
                    param.grad = value if param.grad is None else param.grad + value

    def run(self, action: Action, received: torch.Tensor | None, target: torch.Tensor | None):
        if action.kind == "F":
            return self.forward(action.microbatch, received, target)
        if action.kind == "B":
            return self.backward(action.microbatch, received)
        return self.weight(action.microbatch)


def _tag(action: Action, schedule: Schedule) -> int:
    kind = ACTION_KINDS.index(action.kind)
    return (kind * schedule.num_stages + action.stage) * schedule.m + action.microbatch


def action_steps(schedule: Schedule) -> dict[Action, int]:
    """Each action's step (1, 2, ...) if every action took one step and started as soon as its
    device is free and its inputs are ready. Every process computes the same numbers."""
    s = schedule
    step, device_free = {}, [0] * s.p
    for d, a in execution_order(s)[0]:  # each action after its dependencies
        inputs = [step[dep] for dep in dependencies(a, s.num_stages, s.split_backward)]
        step[a] = device_free[d] = 1 + max([device_free[d]] + inputs)
    return step


def batches(program: list, schedule: Schedule) -> list:
    """One device's ``program`` (from ``lower``) in the order the executor posts it: compute ops,
    and between them lists of recv / send ops, each list posted as one batch.

    A message is posted at the step of the action that produced it, on both ends: a send
    right after its compute, a receive after this device's last compute at or before that
    step (possibly well before the compute that needs it). Computes keep their order.
    """
    step = action_steps(schedule)
    ordered = sorted(program, key=lambda op: (step[op.action], op.kind != "compute"))  # a stable sort
    plan = []
    for op in ordered:
        if op.kind == "compute":
            plan.append(op)
        elif plan and isinstance(plan[-1], list):
            plan[-1].append(op)
        else:
            plan.append([op])
    return plan


def post(messages: list, inbox: dict, outbox: dict, schedule: Schedule, shape, device) -> list:
    """Post one batch of recv / send ops with ``batch_isend_irecv``; a receive lands in a new
    ``inbox`` tensor of ``shape`` [b, width]. Returns (op, work to wait on, tensor) per op."""
    p2p = []
    for op in messages:
        if op.kind == "recv":
            inbox[op.action] = tensor = torch.empty(shape, device=device)
        else:
            tensor = outbox.pop(op.action)
        p2p.append(
            dist.P2POp(
                dist.isend if op.kind == "send" else dist.irecv,
                tensor,
                op.peer,
                tag=_tag(op.action, schedule),
            )
        )
    works = dist.batch_isend_irecv(p2p)
    if len(works) != len(p2p):  # NCCL: one work for the whole batch
        works = works * len(p2p)
    return list(zip(messages, works, [p.tensor for p in p2p], strict=False))


def _named(action: Action):
    """``cluster.region(str(action))`` on a modeled cluster, else nothing."""
    return cluster.region(str(action)) if cluster.installed() is not None else contextlib.nullcontext()


def run_step(program: list, workers: dict, schedule: Schedule, data: tuple, device: torch.device) -> tuple:
    """One training step: this rank's lowered ``program`` (recv / compute / send ops), its
    messages posted in batches (see ``batches``).

    ``workers``: stage -> StageWorker of this rank; ``data``: the micro-batches
    (xs, ys); activations and gradients between stages have the targets' shape
    [b, width]. Returns [(action, start ms, end ms)] and the step's wall time in ms.
    """
    s, rank, (xs, ys) = schedule, dist.get_rank(), data
    inbox, outbox, arriving, sending, spans = {}, {}, {}, [], []
    plan = batches(program, s)
    t0 = now()
    origin = CudaSpan(device).start()  # time zero of this step's timeline
    for item in plan:
        if isinstance(item, list):  # messages: post them together, move on
            # details: post the batch; keep each receive's work, and each sent tensor until it is sent
            for op, work, tensor in post(item, inbox, outbox, s, ys[0].shape, device):
                if op.kind == "recv":
                    arriving[op.action] = work
                else:
                    sending.append((work, tensor))  # the tensor lives until its send is done
            # end details
            continue
        a = item.action
        # details: wait for the tensor this compute needs (F: from stage n-1, B: from stage n+1)
        source = {
            "F": Action("F", a.stage - 1, a.microbatch),
            "B": Action("B", a.stage + 1, a.microbatch),
        }.get(a.kind)
        if source in arriving:  # wait for the tensor this compute needs
            arriving.pop(source).wait()
        first_f, last_f = a.kind == "F" and a.stage == 0, a.kind == "F" and a.stage == s.num_stages - 1
        received = xs[a.microbatch].to(device) if first_f else inbox.pop(source, None)
        target = ys[a.microbatch].to(device) if last_f else None
        # end details
        span = CudaSpan(device, origin).start()  # on a GPU: events on the compute stream,
        with _named(a):  # on a modeled cluster: a span named F(n,j) on the rank's timeline
            out = workers[a.stage].run(a, received, target)  # F, B or W of one stage, one micro-batch
        spans.append((a, span.end()))  # so waiting for a message is not billed to it
        # details: hand the output to the next stage: here (inbox), or to a later send op (outbox)
        nxt = consumer_stage(a)
        if out is not None and 0 <= nxt < s.num_stages:  # to the next stage: here, or via a send op
            (inbox if s.device_of(nxt) == rank else outbox)[a] = out.detach()
        # end details
    for work, _ in sending:
        work.wait()
    synchronize(device)
    return [(a, *span.interval()) for a, span in spans], (now() - t0) * 1e3


class ScheduleRunner:
    """One schedule on this rank: its stages (built from ``config``), their workers and
    its lowered program. ``step()`` runs one training step; ``result()`` reports."""

    def __init__(self, schedule: Schedule, config: MLPConfig, device: torch.device):
        s, rank = schedule, dist.get_rank()
        modules = config.stages(s.num_stages, device)
        self.workers = {
            n: StageWorker(modules[n].to(device), n, s.num_stages, s.m, s.split_backward)
            for n in range(s.num_stages)
            if s.device_of(n) == rank
        }
        self.schedule, self.device, self.steps, self.windows = s, torch.device(device), [], []
        self.data, self.program = config.microbatches(s.m, device), lower(s)[rank]

    def step(self) -> None:
        for w in self.workers.values():
            w.module.zero_grad(set_to_none=True)
            w.losses.clear()
        dist.barrier()  # all ranks start the step together
        start = cluster.modeled_ns() if cluster.installed() is not None else 0
        self.steps.append(run_step(self.program, self.workers, self.schedule, self.data, self.device))
        if cluster.installed() is not None:  # the step's stretch of this rank's modeled timeline
            self.windows.append((start, cluster.modeled_ns()))

    def result(self) -> dict:
        """Per step its time (ms) and its [(action, start ms, end ms)]; the last stage's
        micro-batch losses (each a share of the mean); the gradients by name (none on meta).
        On a modeled cluster also each step's ``(start ns, end ns)`` and the rank's timeline."""
        workers = self.workers.values()
        return {
            "times": [ms for _, ms in self.steps],
            "events": [events for events, _ in self.steps],
            "losses": [loss for w in workers for loss in w.losses],
            "grads": {
                name: p.grad.cpu()
                for w in workers
                for name, p in w.module.named_parameters()
                if self.device.type != "meta"
            },
            "windows": self.windows,
            "timeline": cluster.timeline() if cluster.installed() is not None else None,
        }
