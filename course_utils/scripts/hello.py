"""What torchrun gives each rank, and one all-reduce (gloo's and the ring by hand).

    torchrun --nproc-per-node 4 -m course_utils.scripts.hello --out DIR

Each rank writes ``DIR/rank<R>.json``: the variables torchrun set, its group's
view of the world, and the results of ``dist.all_reduce`` and
``ring_all_reduce`` on the same tensor (rank r holds ``(r + 1) * [1, 2, ..., 8]``).

Taught in chapter 02 (section 5, torchrun; appendix 02a, section 4: mp.spawn and two "nodes" on one
machine).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

TORCHRUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def report() -> dict:
    """This rank's report; needs the default process group."""
    import torch
    import torch.distributed as dist

    from course_utils.collectives import ring_all_reduce
    from course_utils.runtime.hardware import rank_device

    rank = dist.get_rank()
    mine = (rank + 1) * torch.arange(1, 9, dtype=torch.float64, device=rank_device())  # [8] float64
    by_gloo, by_ring = mine.clone(), ring_all_reduce(mine.clone())
    dist.all_reduce(by_gloo)
    return {
        "env": {name: os.environ.get(name) for name in TORCHRUN_VARIABLES},
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "launcher_pid": os.getppid(),  # the torchrun process that started this rank
        "all_reduce": by_gloo.tolist(),
        "ring_all_reduce": by_ring.tolist(),
    }


def _report_and_leave(out: Path, say: bool) -> None:
    import torch.distributed as dist

    result = report()
    (Path(out) / f"rank{result['rank']}.json").write_text(json.dumps(result))
    if say:  # ranks print at the same time: lines may come out in any order, even mixed
        print(
            f"rank {result['rank']} of {result['world_size']}: all_reduce sum {sum(result['all_reduce']):g}"
        )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: the rank, world size and meeting place come from the environment."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<R>.json")
    args = parser.parse_args(argv)

    import torch

    from course_utils.collectives import init_group

    torch.set_num_threads(1)
    init_group("gloo")  # init_method="env://": reads what torchrun set
    _report_and_leave(args.out, say=True)


def spawned(index: int, world_size: int, init_method: str, out: str) -> None:
    """Entry point under ``torch.multiprocessing.spawn``, which calls it as process ``index``.

    mp.spawn sets no environment variables, so the rank, the world size and the
    meeting place (``tcp://host:port``) are passed in.
    """
    import torch

    from course_utils.collectives import init_group

    torch.set_num_threads(1)
    init_group("gloo", init_method=init_method, rank=index, world_size=world_size)
    _report_and_leave(Path(out), say=False)  # its stdout is the notebook's: keep it clean


if __name__ == "__main__":
    main()
