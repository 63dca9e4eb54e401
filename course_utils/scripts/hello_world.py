"""Hello world under torchrun: the smallest distributed program.

    torchrun --nproc-per-node 2 -m course_utils.scripts.hello_world

torchrun starts one process per rank and sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT in each; ``init_process_group`` reads them. Every
rank holds ``rank + 1``, one ``all_reduce`` sums them, and every rank prints one
line. Plain PyTorch only: copy it as the skeleton of a script of your own.

Taught in chapter 00 (section 3).
"""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])  # this process's number on its machine
    one_gpu_each = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    if one_gpu_each:  # NCCL needs a GPU of its own for every process
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if one_gpu_each else "gloo")  # env://: the variables above
    rank, world_size = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1.0], device="cuda" if one_gpu_each else "cpu")
    dist.all_reduce(t)  # SUM over the ranks, result on every rank
    # one write per line: the ranks share torchrun's output, and a print's text and its newline
    # can go out as two writes (unbuffered output), letting another rank's line in between
    sys.stdout.write(f"hello from rank {rank} of {world_size}: all_reduce gave {t.item():g}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
