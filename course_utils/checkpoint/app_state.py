"""Everything a run needs, as one object DCP can save and load: the ``Stateful`` protocol.

``torch.distributed.checkpoint`` (DCP) accepts, as a value of the dict it saves or loads, any
object with ``state_dict()`` and ``load_state_dict(state)`` (the runtime-checkable protocol
``torch.distributed.checkpoint.stateful.Stateful``). ``dcp.save`` calls ``state_dict()``;
``dcp.load`` calls ``state_dict()`` to learn what to read (and into which tensors), reads the
checkpoint into it, then calls ``load_state_dict`` with the result. ``AppState`` gathers the
model, the optimizer, the data position and the step count that way.

The model and optimizer parts go through ``torch.distributed.checkpoint.state_dict``:
``get_state_dict(model, optimizer)`` returns both under the parameters' fully qualified names
(``table.weight``, with no ``module.`` prefix from DDP, and the optimizer state keyed by those
names instead of by position), the same for a plain module, DDP or FSDP; ``set_state_dict``
puts them back. So a checkpoint taken under DDP loads into an unwrapped model, or into another
number of ranks.

Taught in chapter 08 (section 4, ``get_state_dict`` and the ``Stateful`` protocol).
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

__all__ = ["AppState"]


class AppState:
    """Model, optimizer, data position (anything with ``state_dict``/``load_state_dict``) and
    the step count, saved and restored as one ``Stateful`` value: ``dcp.save({"app": AppState(...)})``."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, data_position, step: int = 0
    ):
        self.model, self.optimizer, self.data_position, self.step = model, optimizer, data_position, step

    def state_dict(self) -> dict:
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            "data": self.data_position.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        self.data_position.load_state_dict(state["data"])
        self.step = int(state["step"])
