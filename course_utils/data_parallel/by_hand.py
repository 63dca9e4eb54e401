"""DataParallel by hand: the steps ``nn.DataParallel`` takes on every forward, over any device list.

One process, one Python thread per device. Every training step::

    inputs   = scatter((dense, sparse), devices)       # split the batch: chunk i -> devices[i]
    replicas = replicate(module, devices)              # copy the *latest* parameters to every device
    outputs  = parallel_apply(replicas, inputs)        # one thread per device runs its replica
    logits   = gather(outputs, devices[0])             # all outputs back on device 0
    loss(logits).backward()                            # gradients of every replica are summed
                                                       # onto the parameters on device 0

Device 0 holds the only real copy of the parameters and the optimizer: it sends
the weights out and collects the gradients back, a parameter server in all but
name. ``DataParallelByHand`` wraps the steps as an ``nn.Module``. On CPU stand-ins
(``devices(2)`` without GPUs) every step runs for real, so the numbers can be
checked against single-device training; only the speed of separate GPUs is missing.

Taught in chapter 03.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import torch
from torch import nn

from course_utils.runtime import compat
from course_utils.runtime.timing import Stopwatch, now, synchronize


def chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """Rows each device gets when ``scatter`` splits ``batch_size`` rows over ``n_devices``.

    ``torch.chunk`` semantics, as ``nn.DataParallel`` uses: chunks of
    ``ceil(batch_size / n_devices)`` rows, the last one smaller, and *fewer chunks
    than devices* when the batch is too small (5 rows on 4 devices: 2, 2, 1).
    """
    if batch_size < 1 or n_devices < 1:
        raise ValueError(f"need batch_size >= 1 and n_devices >= 1, got {batch_size} and {n_devices}")
    return [len(c) for c in torch.empty(batch_size).chunk(n_devices)]


def scatter(
    tensors: Sequence[torch.Tensor], devices: Sequence[torch.device]
) -> list[tuple[torch.Tensor, ...]]:
    """Split every tensor ``[B, ...]`` along dim 0 and send chunk ``i`` to ``devices[i]``.

    Returns one tuple of input chunks per device used (``len(chunk_sizes(B, n))``
    of them, which can be fewer than ``len(devices)`` for a tiny batch).
    """
    if not tensors:
        raise ValueError("scatter needs at least one input tensor")
    rows = {t.shape[0] for t in tensors}
    if len(rows) != 1:
        raise ValueError(f"every input must have the same number of rows to be split, got {sorted(rows)}")
    per_tensor = [t.chunk(len(devices)) for t in tensors]
    return [
        tuple(chunks[i].to(devices[i], non_blocking=True) for chunks in per_tensor)
        for i in range(len(per_tensor[0]))
    ]


class Broadcast(torch.autograd.Function):
    """Forward: copy tensors to every device. Backward: *reduce-add* their gradients onto the source.

    The backward is DataParallel's "gradients go back to device 0" step: the
    gradient a parameter gets is the sum of the gradients of all its replicas.
    ``nn.DataParallel`` does the same (``Broadcast`` / ``ReduceAddCoalesced``), with
    two differences: ``comm.broadcast_coalesced`` hands device 0 the original tensors
    instead of a copy, and moves the others in large flat buffers (NCCL when available).
    """

    @staticmethod
    def forward(ctx, devices, timings, *tensors):
        # details: remember the sources and the devices for backward
        ctx.n, ctx.sources, ctx.timings = len(tensors), [t.device for t in tensors], timings
        ctx.devices = devices
        # end details
        return tuple(t.detach().to(d, copy=True) for d in devices for t in tensors)  # replica-major

    @staticmethod
    def backward(ctx, *grads):
        with Stopwatch(*ctx.devices) as watch:  # on GPUs: waits for the copies, then reads the clock
            summed = []
            for i, source in enumerate(ctx.sources):
                total = None
                for g in grads[i :: ctx.n]:  # replica 0, 1, ...: add each onto the source device
                    if g is not None:
                        total = g.to(source, copy=True) if total is None else total.add_(g.to(source))
                summed.append(total)
        # details: record the seconds for DataParallelByHand.last_timings
        if ctx.timings is not None:
            ctx.timings["reduce_gradients"] = watch.seconds
        # end details
        return (None, None, *summed)


def replicate(
    module: nn.Module, devices: Sequence[torch.device], timings: dict | None = None
) -> list[nn.Module]:
    """One replica of ``module`` per device, holding copies of its *current* parameters.

    The copies stay connected to the originals through autograd (``Broadcast``),
    so ``backward`` on anything computed by the replicas sums their gradients into
    the original parameters' ``.grad``. Buffers are copied without gradients.

    Simpler than ``torch.nn.parallel.replicate`` in one respect: replica 0 gets
    copies too (of the parameters and of the buffers), where PyTorch's replica 0
    shares the original tensors, so in-place buffer updates in ``forward`` (BatchNorm's
    running statistics) reach the original module there and are lost here.
    """
    names = [name for name, _ in module.named_parameters()]
    params = [p for _, p in module.named_parameters()]
    copies = Broadcast.apply(devices, timings, *params) if params else ()
    replicas = []
    for r, device in enumerate(devices):
        replica = compat.module_tree_copy(module, device)  # shared code, buffers copied to device
        mine = copies[r * len(params) : (r + 1) * len(params)]
        for name, copy in zip(names, mine, strict=True):  # this device's copies, linked to the originals
            compat.set_parameter(replica, name, copy)
        replicas.append(replica)
    return replicas


def parallel_apply(
    replicas: Sequence[nn.Module], inputs: Sequence[tuple], devices: Sequence[torch.device]
) -> list:
    """Run ``replicas[i](*inputs[i])`` in one Python thread per replica; outputs in device order.

    Each thread turns on the caller's grad mode (it is thread-local) and, on a
    GPU, makes its device current. An exception in a thread is re-raised here,
    naming the replica.
    """
    # details: check one input tuple and one device per replica
    if not len(replicas) == len(inputs) <= len(devices):
        raise ValueError(
            f"need one input tuple per replica and a device for each: got {len(replicas)} "
            f"replicas, {len(inputs)} inputs, {len(devices)} devices"
        )
    # end details
    grad_enabled = torch.is_grad_enabled()
    results: list = [None] * len(replicas)

    def work(i: int) -> None:
        device = devices[i]
        on_gpu = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        try:
            with torch.set_grad_enabled(grad_enabled), on_gpu:
                results[i] = replicas[i](*inputs[i])
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # details: re-raise a replica's exception here, naming the replica and its device
    for i, out in enumerate(results):
        if isinstance(out, BaseException):
            raise RuntimeError(f"replica {i} on {devices[i]} failed: {type(out).__name__}: {out}") from out
    # end details
    return results


def gather(outputs: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenate the replicas' outputs ``[b_i, ...]`` on ``device`` -> ``[sum b_i, ...]``.

    Scalars (a model that returns its loss) become a vector ``[n_replicas]``, one entry
    per replica, as ``nn.DataParallel``'s gather does. Differentiable: the backward
    splits the gradient and sends each piece back to the device its rows came from.
    """
    if all(o.dim() == 0 for o in outputs):  # one loss per replica: stack them, as torch's Gather does
        outputs = [o.view(1) for o in outputs]
    return torch.cat([o.to(device) for o in outputs], dim=0)


class DataParallelByHand(nn.Module):
    """``nn.DataParallel`` rebuilt from the four steps above, for any list of devices.

    module: its parameters must live on ``devices[0]`` (the optimizer updates them there).
    forward(*inputs): each input ``[B, ...]`` is split by rows; returns the gathered
        output ``[B, ...]`` on ``devices[0]``, exactly what ``module(*inputs)`` returns
        up to float rounding. ``last_timings`` holds the seconds of each step of the
        last call (``reduce_gradients`` appears after its backward), measured with the
        devices synchronised (``course_utils.runtime.timing``), so GPU work counts where it ran.
    """

    def __init__(self, module: nn.Module, devices: Sequence[torch.device]):
        super().__init__()
        devices = [torch.device(d) for d in devices]
        if not devices:
            raise ValueError("DataParallelByHand needs at least one device, e.g. course_utils.devices(2)")
        wrong = {str(t.device) for t in [*module.parameters(), *module.buffers()] if t.device != devices[0]}
        if wrong:
            raise ValueError(
                f"the module's parameters and buffers must be on devices[0]={devices[0]}, "
                f"found some on {sorted(wrong)}; call module.to(devices[0]) first"
            )
        self.module, self.devices = module, devices
        self.last_timings: dict[str, float] = {}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(self.devices) == 1:
            return self.module(*inputs)
        timings: dict[str, float] = {}
        synchronize(*self.devices)  # GPU work runs on after its call returns: wait for it
        clock = now()

        def lap(step: str) -> None:
            nonlocal clock
            synchronize(*self.devices)
            lapped = now()
            timings[step], clock = lapped - clock, lapped

        chunks = scatter(inputs, self.devices)
        lap("scatter")
        replicas = replicate(
            self.module, self.devices[: len(chunks)], timings if torch.is_grad_enabled() else None
        )
        lap("replicate")
        outputs = parallel_apply(replicas, chunks, self.devices)
        lap("parallel_apply")
        out = gather(outputs, self.devices[0])
        lap("gather")
        self.last_timings = timings
        return out


class ModelWithLoss(nn.Module):
    """``model`` plus its loss: ``forward(dense [B, n_dense], sparse [B, n_tables], label [B])``
    returns the mean binary cross-entropy, a scalar.

    A common pattern (Hugging Face models return their loss): under DataParallel
    every replica returns its own chunk's loss, and the gathered result is a vector
    ``[n_replicas]`` that needs ``.mean()`` (exact when the chunks are equal in size).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(self.model(dense, sparse), label)
