"""A DCP checkpoint of the TorchRec twin, and a resume that must equal the run it interrupted.

    save(model, optimizer, path)    every rank writes its pieces (torch.distributed.checkpoint):
        the tables' and the fused optimizer's ShardedTensors, the dense layers and their
        optimizer's tensors once
    load(model, optimizer, path)    DCP fills this rank's pieces in place, then both take them back
    resume_run(...)                 every rank: steps [start, stop) of an epoch, loading or saving
    run_resume(...)                 uninterrupted vs stopped, saved, restarted from other weights and
                                    loaded: every tensor compared with torch.equal

Taught in chapter 07 (appendix 07a, TorchRec).
"""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from course_utils.runtime.launcher import launch
from course_utils.sharding.torchrec_dlrm import local_tensors, require_torchrec
from course_utils.sharding.torchrec_train import build, train_torchrec, with_defaults
from course_utils.workload.data import ClickLogs

__all__ = ["save", "load", "resume_run", "run_resume"]


def _state(model, optimizer) -> dict:
    """What a checkpoint holds: the model's state dict (tables as ShardedTensors) and the combined
    optimizer's (the fused optimizer's sums as ShardedTensors, the dense optimizer's tensors)."""
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


def save(model, optimizer, path) -> None:
    """Every rank writes its pieces of the model and optimizer to ``path`` (``dcp.save``)."""
    dcp.save(_state(model, optimizer), checkpoint_id=str(path))


def load(model, optimizer, path) -> None:
    """Load ``path`` into this model and optimizer (same plan): DCP fills this rank's pieces of
    their state dicts in place, then both take them back (``load_state_dict``)."""
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])


def resume_run(train: ClickLogs, options: dict, start: int, stop: int, load_from=None, save_to=None):
    """In every rank: the TorchRec twin trained on steps ``[start, stop)`` of ``train``'s epoch; with
    ``load_from``, it starts from other random weights (``seed + 1``) and then loads that checkpoint,
    so whatever the checkpoint missed would show. Returns ``(step losses, local_tensors)``."""
    o = with_defaults(options)
    model, optimizer, _ = build(train, o, o["seed"] + (load_from is not None))
    if load_from is not None:
        load(model, optimizer, load_from)
    losses = train_torchrec(
        model, optimizer, train, batch_size=o["batch_size"], start=start, stop=stop, pipelined=o["pipelined"]
    )
    if save_to is not None:
        save(model, optimizer, save_to)
    return losses, local_tensors(model, optimizer)


def run_resume(
    train: ClickLogs, path, *, steps: int, stop_at: int, world_size: int = 2, timeout=300, **options
):
    """Three launches on ``world_size`` CPU ranks: ``steps`` steps without a stop; ``stop_at`` steps
    then a DCP checkpoint in ``path``; a fresh start that loads it and trains the rest.

    Returns ``{"identical", "max_difference", "tensors", "fused_state", "losses_equal"}``: whether
    every rank's tensors (tables, dense layers, both optimizers' state) equal the uninterrupted
    run's bit for bit (``torch.equal``), the largest difference, how many tensors were compared
    (of them, pieces of the fused optimizer's state), and whether the step losses agree.
    """
    require_torchrec()
    options = with_defaults(options)
    per_epoch = -(-len(train) // options["batch_size"])
    if not 0 < stop_at < steps <= per_epoch:
        raise ValueError(
            f"need 0 < stop_at < steps <= {per_epoch} (the steps of one epoch over {len(train)} rows "
            f"in batches of {options['batch_size']}); got stop_at={stop_at}, steps={steps}"
        )

    def run(*args):
        return launch(
            resume_run,
            train,
            options,
            *args,
            world_size=world_size,
            backend="gloo",
            timeout=timeout,
            show_output=False,
        )

    whole = run(0, steps)
    first = run(0, stop_at, None, str(path))
    rest = run(stop_at, steps, str(path))
    compared, fused, largest, identical = 0, 0, 0.0, True
    for (_, a), (_, b) in zip(whole, rest, strict=True):
        identical &= a.keys() == b.keys()  # the same tensors, by name and piece
        for name in a.keys() & b.keys():
            compared += 1
            fused += name.startswith("optim/sparse.")
            identical &= torch.equal(a[name], b[name])
            largest = max(largest, (a[name].double() - b[name].double()).abs().max().item())
    losses_equal = whole[0][0] == first[0][0] + rest[0][0]
    return {
        "identical": identical,
        "max_difference": largest,
        "tensors": compared,
        "fused_state": fused,
        "losses_equal": losses_equal,
    }
