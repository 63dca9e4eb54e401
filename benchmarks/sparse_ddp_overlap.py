"""Does DDP's sparse all-reduce, overlapped with the backward pass, still crash this torch?

    python benchmarks/sparse_ddp_overlap.py                      # 20 launches x 2000 steps each way
    python benchmarks/sparse_ddp_overlap.py --launches 50 --ways average_after_backward

Trains appendix 04a's ``BigTableModel`` (a 200,000 x 64 ``EmbeddingBag`` with sparse gradients, then
a linear layer) on 2 gloo ranks, in two ways:

* ``ddp``: DDP all-reduces every gradient, the table's sparse one included, in gloo's worker
  threads while the backward pass goes on (the overlap DDP is built for);
* ``average_after_backward``: DDP all-reduces the head only; the table's gradient is averaged by
  ``average_sparse_gradient`` once backward has returned, with nothing else running.

Printed per way: how many launches died (and of which signal), and the training steps that ran.
With torch 2.13 on a 2-core CPU, ``ddp`` lost 2 of 20 launches (SIGSEGV in ``malloc``, called from
``AsyncSparseAllreduceWork``'s ``coalesce`` on a gloo worker, on a heap already corrupted) and
``average_after_backward`` none of 50. If a newer torch loses none either way, the course can let
DDP average the table again (``train_big_table``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_utils import RankFailedError, launch
from course_utils.ddp.sparse_tables import BigTableModel, average_sparse_gradient

WAYS = ("ddp", "average_after_backward")


def train(way: str, steps: int, rows: int) -> int:
    """``steps`` steps of random 64 x 8 id bags on this rank; returns ``steps``."""
    module = BigTableModel(rows, 64, seed=0)
    if way == "average_after_backward":
        DDP._set_params_and_buffers_to_ignore_for_model(module, ["table.weight"])
    model = DDP(module)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        loss = model(torch.randint(rows, (64, 8), generator=generator)).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if way == "average_after_backward":
            average_sparse_gradient(module.table.weight)
        optimizer.step()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20, help="launches per way")
    parser.add_argument("--steps", type=int, default=2000, help="training steps per launch")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = parser.parse_args()
    for way in args.ways:
        deaths, start = [], time.perf_counter()
        for _ in range(args.launches):
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    launch(train, way, args.steps, args.rows, world_size=2, timeout=600)
            except RankFailedError as err:
                signal = re.search(r"signal (SIG\w+)", err.message)
                deaths.append(signal.group(1) if signal else err.exc_type)
        how = f" ({', '.join(sorted(deaths))})" if deaths else ""
        print(
            f"{way:>24}: {len(deaths)} of {args.launches} launches died{how}; "
            f"up to {args.launches * args.steps:,} steps in {time.perf_counter() - start:.0f} s"
        )


if __name__ == "__main__":
    main()
