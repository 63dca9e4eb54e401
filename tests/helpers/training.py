"""Chapter 03's training loop, shared by its CPU tests (tests/test_data_parallel.py) and their GPU
twins (tests/gpu/test_data_parallel_gpus.py)."""

import itertools

import torch


def train_sgd(model, logs, steps, batch_size=1024, lr=0.1):
    """Chapter 03's loop: SGD on the first ``steps`` batches, where the model's parameters are.
    ``model`` may be wrapped (``nn.DataParallel``, ``DataParallelByHand``). Returns the losses."""
    home = next(model.parameters()).device
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for b in itertools.islice(logs.batches(batch_size), steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(b.dense.to(home), b.sparse.to(home)), b.label.to(home)
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
