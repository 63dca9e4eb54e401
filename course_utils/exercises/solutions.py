"""Worked solutions of the "build it" exercises, one function (or class) per exercise.

A chapter shows a blank stub and its checker, and points here for one way to write it; each
solution passes its checker (tests/test_exercises.py).

Taught in chapters 02, 03, 04, 05, 06, 07 and 08 (the worked solutions of their "build it" exercises).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

__all__ = [
    "ring_all_reduce",
    "bucketed_gradient_sync",
    "PositionSampler",
    "row_wise_lookup",
    "one_f_one_b_order",
]


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Chapter 02: sum ``tensor`` over the default group in place, in a ring.

    Reduce-scatter: at step s, send chunk (r - s) % w right, add chunk (r - s - 1) % w from the
    left. All-gather: send the finished chunk (r + 1 - s) % w right, copy chunk (r - s) % w in.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), world)  # views: writing them writes tensor
    right, left = (rank + 1) % world, (rank - 1) % world
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(world - 1):
            if phase == "reduce-scatter":
                send, receive = (rank - step) % world, (rank - step - 1) % world
            else:
                send, receive = (rank + 1 - step) % world, (rank - step) % world
            incoming = torch.empty_like(chunks[receive])
            sending = dist.isend(chunks[send], right)
            dist.irecv(incoming, left).wait()
            sending.wait()
            if phase == "reduce-scatter":
                chunks[receive].add_(incoming)
            else:
                chunks[receive].copy_(incoming)
    return tensor


def bucketed_gradient_sync(model: torch.nn.Module, bucket_bytes: int) -> None:
    """Chapter 04: after backward, average every ``p.grad`` over the ranks, in buckets.

    Gradients go into a bucket in parameter order until the next one would pass
    ``bucket_bytes``; each bucket is flattened into one buffer, all-reduced once, divided by the
    world size, and its slices copied back into the gradients.
    """
    world = dist.get_world_size()
    buckets, held = [], bucket_bytes + 1  # the first gradient opens a bucket
    for p in model.parameters():
        if p.grad is None:
            continue
        size = p.grad.numel() * p.grad.element_size()
        if held + size > bucket_bytes:
            buckets.append([])
            held = 0
        buckets[-1].append(p)
        held += size
    for bucket in buckets:
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in bucket:
            p.grad.copy_(flat[offset : offset + p.grad.numel()].view_as(p.grad))
            offset += p.grad.numel()


class PositionSampler(DistributedSampler):
    """Chapter 08: a ``DistributedSampler`` that saves how far this rank got into the epoch.

    ``advance(n)`` after each batch of ``n``; ``state_dict()`` is ``{"epoch", "position"}``;
    after ``load_state_dict``, iterating skips the first ``position`` samples of the epoch's
    order, and ``set_epoch`` of another epoch starts that one from its beginning.
    """

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, **kwargs)
        self.position = 0

    def advance(self, n: int) -> None:
        self.position += n

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.position = 0
        super().set_epoch(epoch)

    def __iter__(self):
        indices = list(super().__iter__())
        return iter(indices[self.position :])

    def __len__(self) -> int:
        return self.num_samples - self.position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


def row_wise_lookup(
    local_rows: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, num_embeddings: int
) -> torch.Tensor:
    """Chapter 07: this rank's bag sums ``[B, D]`` from a table split by rows over the ranks.

    local_rows: ``[R, D]``, rows ``rank * R`` on of the table (``R = ceil(num_embeddings / W)``);
    ids: ``[L]`` global ids of this rank's bags; offsets: ``[B]`` where each bag starts.
    Each id goes to its owner (all-to-all, counts first), the owner adds up its rows per bag,
    and the partial sums come back (all-to-all) to be added up.
    """
    world = dist.get_world_size()
    size = -(-num_embeddings // world)
    bags = len(offsets)
    lengths = torch.diff(offsets, append=torch.tensor([len(ids)]))
    bag_of_id = torch.repeat_interleave(torch.arange(bags), lengths)
    owner = ids // size
    order = owner.argsort(stable=True)
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # how many ids each rank sends me
    bag_counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(bag_counts, torch.tensor([bags]))  # every rank's number of bags
    bag_counts = torch.cat(bag_counts)
    # (bag, local row) of each id, grouped by owner
    pairs = torch.stack([bag_of_id[order], ids[order] - owner[order] * size], dim=1)
    received = torch.empty(int(recv_counts.sum()), 2, dtype=torch.long)
    dist.all_to_all_single(
        received, pairs, output_split_sizes=recv_counts.tolist(), input_split_sizes=send_counts.tolist()
    )
    # partial sums, for each source rank's bags, of the rows held here
    source = torch.repeat_interleave(torch.arange(world), recv_counts)
    first_bag = torch.cat([torch.zeros(1, dtype=torch.long), bag_counts.cumsum(0)[:-1]])
    partial = torch.zeros(int(bag_counts.sum()), local_rows.shape[1], dtype=local_rows.dtype)
    partial.index_add_(0, first_bag[source] + received[:, 0], local_rows[received[:, 1]])
    back = torch.empty(world * bags, local_rows.shape[1], dtype=local_rows.dtype)
    dist.all_to_all_single(
        back, partial, output_split_sizes=[bags] * world, input_split_sizes=bag_counts.tolist()
    )
    return back.view(world, bags, -1).sum(0)


def one_f_one_b_order(stages: int, microbatches: int) -> list[list[str]]:
    """Chapter 06: each stage's 1F1B order, e.g. ``["F0", "F1", "B0", "F2", "B1", ...]``.

    Stage d warms up with ``stages - 1 - d`` forwards, then runs one forward and one backward
    until the forwards are done, then the backwards left (the cool-down).
    """
    orders = []
    for stage in range(stages):
        warmup = min(stages - 1 - stage, microbatches)
        order = [f"F{j}" for j in range(warmup)]
        next_backward = 0
        for j in range(warmup, microbatches):
            order += [f"F{j}", f"B{next_backward}"]
            next_backward += 1
        order += [f"B{j}" for j in range(next_backward, microbatches)]
        orders.append(order)
    return orders


def tensor_parallel_mlp(
    x: torch.Tensor,
    first_weight: torch.Tensor,
    first_bias: torch.Tensor,
    second_weight: torch.Tensor,
    second_bias: torch.Tensor,
) -> torch.Tensor:
    """Chapter 05: the Megatron-LM MLP's forward, ``x [B, d] -> [B, d_out]`` on every rank.

    This rank's hidden features need no communication (the first weight is split by output
    features); its columns of the second weight give a partial sum of the output, summed over
    the ranks by one all-reduce; the bias, whole on every rank, is added once, after it.
    """
    hidden = torch.relu(x @ first_weight.T + first_bias)  # [B, h / w]: this rank's features
    out = hidden @ second_weight.T  # [B, d_out]: this rank's share of the sum
    dist.all_reduce(out)
    return out + second_bias


def data_parallel_loss(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, devices
) -> torch.Tensor:
    """Chapter 03: one DataParallel forward by hand, and the loss over the whole batch.

    Scatter: ``torch.chunk`` the rows over the devices. Replicate: each replica's parameters
    are the model's moved to its device (``.to`` is recorded by autograd, so the gradients flow
    back to the one real copy). Apply: each replica on its chunk. Gather: the outputs, in chunk
    order, on ``devices[0]``; then one loss.
    """
    from torch.func import functional_call

    chunks = inputs.chunk(len(devices))
    outputs = []
    for chunk, device in zip(chunks, devices, strict=False):  # a tiny batch can use fewer devices
        params = {name: p.to(device) for name, p in model.named_parameters()}
        outputs.append(functional_call(model, params, (chunk.to(device),)))
    gathered = torch.cat([out.to(devices[0]) for out in outputs])
    return torch.nn.functional.mse_loss(gathered, targets.to(devices[0]))
