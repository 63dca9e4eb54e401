"""The canonical DDP script's twin for one process: the same data, model and training, no DDP.

    python -m course_utils.scripts.one_process --out DIR

What ``ddp_canonical.main`` starts from: one process on one device, a ``DataLoader`` that
shuffles all the rows itself, the held-out log loss of the whole model, and the checkpoint
``DIR/model.pt``. Its arguments, data and evaluation are ``ddp_canonical``'s, so the chapter can
print the DDP script as its change from this one (``show_diff``). On one rank the DDP script
trains the same model: with one batch per epoch (``--batch`` at least ``--rows``) the two
write the same weights, to float rounding (the rows are summed in another order).

Taught in chapter 04 (section 8, PyTorch's canonical DDP script).
"""

from __future__ import annotations

import json

import torch
from torch import nn
from torch.utils.data import DataLoader

from course_utils.scripts.ddp_canonical import datasets, parse, summed_loss_local
from course_utils.workload.models import DLRMConfig


def main(argv=None) -> None:
    args = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)  # the DataLoader's shuffle
    try:
        train, held_out, cardinalities = datasets(args)
        model = DLRMConfig(cardinalities).build(seed=args.seed).to(device)
        optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr)
        loader = DataLoader(train, batch_size=args.batch, shuffle=True)  # all the rows
        for _epoch in range(args.epochs):
            for dense, sparse, label in loader:
                optimizer.zero_grad()
                logits = model(dense.to(device), sparse.to(device))
                nn.functional.binary_cross_entropy_with_logits(logits, label.to(device)).backward()
                optimizer.step()
        report = {"logloss": summed_loss_local(model, held_out, device)}  # held-out log loss
        # details: add the step count, write DIR/report.json
        report.update(steps=args.epochs * len(loader))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report))
        # end details
        torch.save(model.state_dict(), args.out / "model.pt")
        print(f"1 process ({device.type}): {report['steps']} steps; saved model.pt")
    finally:
        pass  # no process group to leave


if __name__ == "__main__":
    main()
