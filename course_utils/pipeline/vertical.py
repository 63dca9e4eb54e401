"""One training step of a vertical split, measured as a pipeline ``Timeline``.

``timed_training_step`` stamps when each part of a ``VerticalSplit`` computes its
forward and its backward, and returns the step as the ``Timeline`` that the
pipeline schedules produce: the picture of devices taking turns (one micro-batch,
so a bubble of ``(p-1)/p``) that pipeline parallelism sets out to fill.

Taught in chapter 05 (section 3, the measured step); chapter 06 starts from it.
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn

from course_utils.model_parallel import VerticalSplit
from course_utils.pipeline.schedules import Action
from course_utils.pipeline.timeline import Event, Timeline
from course_utils.runtime.timing import synchronize

__all__ = ["timed_training_step"]


def timed_training_step(
    split: VerticalSplit, x: torch.Tensor, y: torch.Tensor, loss_fn=nn.functional.mse_loss
):
    """Run one forward + backward of ``split`` and measure when each part worked.

    Returns a pipeline ``Timeline`` (ms) with F(k,0) and B(k,0) per part k on row k:
    hooks stamp each part's forward start/end and the moment autograd reaches
    each part's output gradient (the start of B(k,0)); B(k,0) ends where B(k-1,0)
    starts, and B(0,0) when ``backward`` returns. Gradients are left in ``.grad``.
    Every stamp first synchronises all the split's devices (a GPU works on after a
    call returns), so each piece of work is charged to the part that did it.
    """
    marks: dict = {}

    def stamp(key):
        def hook(*_):
            synchronize(*split.devices)
            marks[key] = time.perf_counter()

        return hook

    hooks = []
    for k, part in enumerate(split.parts):
        hooks += [
            part.register_forward_pre_hook(stamp(("F0", k))),
            part.register_forward_hook(stamp(("F1", k))),
            part.register_full_backward_pre_hook(stamp(("B0", k))),
        ]
    try:
        with warnings.catch_warnings():  # part 0's input needs no gradient: its pre-hook still fires
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            synchronize(*split.devices)
            t0 = time.perf_counter()
            loss = loss_fn(split(x), y.to(split.devices[-1]))
            loss.backward()
            stamp(("B0", -1))()
    finally:
        for h in hooks:
            h.remove()
    events = []
    for k in range(len(split.parts)):
        ms = lambda key: (marks[key] - t0) * 1e3  # noqa: E731
        events.append(Event(k, Action("F", k, 0), ms(("F0", k)), ms(("F1", k))))
        events.append(Event(k, Action("B", k, 0), ms(("B0", k)), ms(("B0", k - 1))))
    return Timeline(tuple(events), len(split.parts), name="vertical model parallel, 1 step", unit="ms")
