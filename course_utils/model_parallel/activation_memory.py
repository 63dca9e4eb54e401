"""What autograd keeps for the backward pass, measured rather than guessed from shapes.

During a forward pass with gradients on, every operation saves the tensors its backward
formula needs (``Linear`` its input, for the weight gradient, and its weight, for the
input gradient when the input needs one; ``ReLU`` its output; ...). Those saved tensors are
the "activations" that make training need more memory than inference.
``torch.autograd.graph.saved_tensors_hooks`` calls a *pack* hook on each of them:
``saved_for_backward`` records every one, counts each storage once (one tensor saved by two
operations, or several views of one tensor, occupy memory once) and separates the
module's own parameters (saved by reference: no memory beyond the weights themselves).

``layer_output_bytes`` is the usual estimate instead, the outputs of every leaf layer,
for comparison: it counts tensors no backward needs (a ``Linear``'s output that only feeds
a ``ReLU``) and misses the module's input, which the first layer keeps.

Taught in chapter 05 (section 2, memory per device).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["SavedForBackward", "layer_output_bytes", "saved_for_backward"]


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    storage = t.untyped_storage()
    return str(t.device), storage.data_ptr()


@dataclass(frozen=True)
class SavedForBackward:
    """Bytes autograd saved during one forward pass (each storage counted once).

    ``activation_bytes``: storages that are not the module's parameters (the memory the
    forward pass adds); ``parameter_bytes``: parameter storages also saved (held anyway);
    ``saved_tensors``: how many times an operation saved a tensor (before deduplication);
    ``output``: the forward's output, so that a caller can go on with it (its graph, and the
    saved tensors with it, live as long as ``output`` does).
    """

    activation_bytes: int
    parameter_bytes: int
    saved_tensors: int
    output: object = field(repr=False, default=None)


def saved_for_backward(module: nn.Module, *inputs) -> SavedForBackward:
    """Run ``module(*inputs)`` with gradients on and measure what autograd saves for backward.

    inputs: the module's usual inputs (e.g. x [B, in]); their storages count as activations
    when an operation saves them (the first ``Linear`` saves x). Returns a ``SavedForBackward``.
    Under ``torch.no_grad()`` nothing is saved; this function turns gradients on itself.
    """
    # details: refuse anything but a module
    if not isinstance(module, nn.Module):
        raise TypeError(f"saved_for_backward needs an nn.Module, got {type(module).__name__}")
    # end details
    parameter_keys = {_storage_key(p) for p in module.parameters()}
    seen: dict[tuple[str, int], int] = {}
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        seen.setdefault(_storage_key(t), t.untyped_storage().nbytes())
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = module(*inputs)
    activations = sum(b for k, b in seen.items() if k not in parameter_keys)
    parameters = sum(b for k, b in seen.items() if k in parameter_keys)
    return SavedForBackward(activations, parameters, count, output)


def layer_output_bytes(module: nn.Module, *inputs) -> int:
    """The estimate from shapes: bytes of the outputs of every leaf layer of ``module`` on
    ``inputs`` (run under ``torch.no_grad``). Compare with ``saved_for_backward``."""
    total = 0

    def add(_mod, _inp, out):
        nonlocal total
        total += out.nbytes

    hooks = [m.register_forward_hook(add) for m in module.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return total
