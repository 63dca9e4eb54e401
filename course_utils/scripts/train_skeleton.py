"""The whole workflow of a distributed training script, in its smallest form.

    torchrun --nproc-per-node 2 -m course_utils.scripts.train_skeleton --out DIR

Eight steps, marked in ``main``: read who this process is from the variables
torchrun sets, take this machine's GPU number ``LOCAL_RANK`` (where each rank
can have a GPU of its own), join the process group, give each rank its own
share of the data (``DistributedSampler``), wrap the model in DDP (which
all-reduces the gradients), train, save once (rank 0), leave the group.
The model is one ``nn.Linear(8, 1)`` on 256 synthetic samples: the point is
the structure. Each rank writes ``DIR/rank<R>.json`` (what it saw and its final
weights) and rank 0 writes ``DIR/model.pt``
(and records what it reads back from it).

Chapter 04 builds the full version (``course_utils/scripts/train_ddp.py``:
a DLRM on Criteo-style data, evaluation, timing).

Taught in chapter 02 (section 1, the whole workflow in one script).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

from course_utils.scripts.rank_exit import run_without_interpreter_shutdown

SAMPLES, FEATURES, BATCH, EPOCHS = 256, 8, 16, 2


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<R>.json and model.pt")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    # 1. who am I: torchrun sets these for every process it starts
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])

    # 2. my device: GPU number LOCAL_RANK on this machine (not RANK: on machine 2, RANK is 8, 9, ...)
    if torch.cuda.device_count() >= local_world_size:  # one GPU for each process here
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        torch.set_num_threads(1)  # CPU ranks share the cores
        device, backend = torch.device("cpu"), "gloo"

    # 3. join the group: env:// reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    dist.init_process_group(backend, timeout=timedelta(seconds=60))

    # 4. data: every rank builds the same dataset; the sampler gives each rank its own share
    g = torch.Generator().manual_seed(0)
    features = torch.randn(SAMPLES, FEATURES, generator=g)
    targets = features @ torch.arange(1.0, FEATURES + 1).unsqueeze(1)  # [256, 1], a linear rule to learn
    dataset = TensorDataset(features, targets)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)  # rank and world size from the group
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    # 5. model: built the same way everywhere, moved to my device, wrapped in DDP
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    # 6. train: DDP all-reduces (averages) the gradients inside backward()
    losses, seen = [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        if epoch == 0:
            seen = list(sampler)  # the dataset indices this rank trains on
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())

    # 7. save once: every rank holds the same weights, so rank 0 writes them
    if rank == 0:
        torch.save(model.module.state_dict(), args.out / "model.pt")  # .module: without the DDP wrapper

    # details: write this rank's report for the notebook (what it saw, its weights, what rank 0 saved)
    saved = {}
    if rank == 0:
        saved = {k: v.tolist() for k, v in torch.load(args.out / "model.pt").items()}  # read it back
    weights = torch.cat([p.detach().cpu().view(-1) for p in model.module.parameters()])
    (args.out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "world_size": world_size,
                "local_rank": local_rank,
                "device": str(device),
                "backend": dist.get_backend(),
                "indices": seen,
                "steps": len(losses),
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "weights": weights.tolist(),
                "saved": saved,
            }
        )
    )
    # end details

    # 8. leave the group
    dist.destroy_process_group()


if __name__ == "__main__":
    run_without_interpreter_shutdown(main)  # why: rank_exit's docstring
