"""Activation recomputation (GPipe's memory trick), measured on one pipeline stage.

A stage of ``L`` blocks ``Linear + ReLU`` on a micro-batch of ``b`` rows keeps, for its
backward, its input ``x [b, width]`` and each block's output: ``(L+1) a`` bytes, where
``a = 4 b width`` is one boundary activation (float32). Under GPipe's order a stage runs
all ``m`` forwards before the first backward, so it holds

    without recomputation   m (L+1) a        every micro-batch's activations
    with recomputation      m a + L a        only each micro-batch's input, plus the
                                             inside of the one stage being recomputed

``torch.utils.checkpoint`` runs the forward without keeping its insides and, in the
backward, runs that micro-batch's forward again: compute goes from F + B to F + B + F.

``SavedActivations`` counts what autograd keeps: a ``saved_tensors_hooks`` pair that adds
each distinct storage's bytes when it is saved and subtracts them when the graph lets go
of it (parameters excluded). The reentrant checkpoint (``use_reentrant=True``) saves its
input and, during the backward, its recomputed activations through these hooks, so they
are all counted; the non-reentrant variant (PyTorch's recommended one, the same memory
saving) keeps its recomputed tensors to itself, out of the hooks' sight.

Taught in chapter 06 (section 8, activation recomputation).
"""

from __future__ import annotations

import statistics
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_utils.pipeline.mlp import MLPConfig
from course_utils.runtime.timing import now

__all__ = ["SavedActivations", "RecomputeRun", "stage_step", "measure_recompute"]


class SavedActivations:
    """Context manager: ``live`` and ``peak`` bytes of the tensors autograd saves for the
    backward inside it, each storage counted once, ``exclude``'s tensors (parameters) not at all."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.refs: dict[int, int] = {}  # storage -> how many saved tensors use it
        self.live = self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    class _Saved:
        def __init__(self, tensor):
            self.tensor = tensor

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr in self.exclude:
            return tensor
        if self.refs.get(ptr, 0) == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        self.refs[ptr] = self.refs.get(ptr, 0) + 1
        saved = self._Saved(tensor)
        weakref.finalize(saved, self._release, ptr, nbytes)  # when the graph drops it
        return saved

    def _release(self, ptr: int, nbytes: int) -> None:
        self.refs[ptr] -= 1
        if self.refs[ptr] == 0:
            del self.refs[ptr]
            self.live -= nbytes

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, SavedActivations._Saved) else saved

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def stage_step(stage: nn.Module, xs, grads, recompute: bool) -> tuple[int, float, float]:
    """One stage under GPipe's order: F of every micro-batch ``xs[j]`` [b, width], then B with
    the output gradients ``grads[j]`` [b, width] (what the next stage would send back).
    Returns (peak saved bytes, forward seconds, backward seconds)."""
    xs = [x.detach().requires_grad_() for x in xs]  # a middle stage: its input needs a gradient
    with SavedActivations(exclude=stage.parameters()) as saved:
        start = now()
        outs = [checkpoint(stage, x, use_reentrant=True) if recompute else stage(x) for x in xs]
        middle = now()
        for out, grad in zip(outs, grads, strict=True):
            out.backward(grad)
        end = now()
    return saved.peak, middle - start, end - middle


@dataclass
class RecomputeRun:
    """One stage's GPipe step measured with and without recomputation, in turns.

    ``peak_bytes``: dict keyed by ``False`` / ``True`` (recompute); ``forward_s``, ``backward_s``:
    the same keys, one time per turn; ``boundary_bytes``: one micro-batch's stage input ``a``."""

    peak_bytes: dict
    forward_s: dict
    backward_s: dict
    boundary_bytes: int
    layers: int
    m: int

    def step_s(self, recompute: bool) -> float:
        """The median step time (forward + backward phases)."""
        steps = zip(self.forward_s[recompute], self.backward_s[recompute], strict=True)
        return statistics.median(f + b for f, b in steps)

    @property
    def slowdown(self) -> float:
        """The median over turns of (step with) / (step without), both measured in the same turn:
        a busy moment of a shared machine slows both alike."""
        without = zip(self.forward_s[False], self.backward_s[False], strict=True)
        with_ = zip(self.forward_s[True], self.backward_s[True], strict=True)
        return statistics.median((fw + bw) / (f + b) for (f, b), (fw, bw) in zip(without, with_, strict=True))

    def memory_formula(self, recompute: bool) -> int:
        """m (L+1) a without; m a + L a with recomputation."""
        a, L, m = self.boundary_bytes, self.layers, self.m
        return m * a + L * a if recompute else m * (L + 1) * a

    def time_formula(self) -> float:
        """(F + B + F) / (F + B), with F and B the median forward and backward phases without."""
        f, b = statistics.median(self.forward_s[False]), statistics.median(self.backward_s[False])
        return (f + b + f) / (f + b)


def measure_recompute(config: MLPConfig, m: int = 8, repeats: int = 7) -> RecomputeRun:
    """``config``'s whole model as one stage, its batch cut into ``m`` micro-batches; the two
    variants take turns ``repeats`` times, after one untimed turn each. Runs in one thread, as
    each rank of a pipeline does (``launch``): threads fighting over busy cores would time that."""
    stage = config.build()
    xs = config.microbatches(m)[0]
    grads = [torch.randn(x.shape, generator=torch.Generator().manual_seed(j)) for j, x in enumerate(xs)]
    peak, fwd, bwd = {}, {False: [], True: []}, {False: [], True: []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for turn in range(repeats + 1):
            for recompute in (False, True):
                peak[recompute], f, b = stage_step(stage, xs, grads, recompute)
                stage.zero_grad(set_to_none=True)
                if turn:  # the first turn warms up
                    fwd[recompute].append(f)
                    bwd[recompute].append(b)
    finally:
        torch.set_num_threads(threads)
    return RecomputeRun(peak, fwd, bwd, xs[0].numel() * xs[0].element_size(), config.layers, m)
