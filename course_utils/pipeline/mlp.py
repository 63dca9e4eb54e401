"""The model the pipeline chapters run: a deep MLP, cut into stages.

``MLPConfig(width, layers, batch)`` builds ``layers`` blocks ``Linear(width,
width) + ReLU`` (standing for a large dense tower, the kind of model pipelining is for;
a DLRM's own MLPs are far too small to cut),
deterministic data ``x [batch, width]``, ``y [batch, width]``, and the loss,
mean squared error over the whole batch. With ``m`` equal micro-batches, the
sum over micro-batches of ``mse(micro-batch) / m`` is that same loss, so a
pipeline's gradients must equal the unpipelined model's.

On the ``meta`` device (``device="meta"``) the same model and data have shapes and no values:
a modeled cluster prices their operators at full size without computing them (appendix 06a's
timing lessons).

Taught in chapter 06 (sections 9 to 11) and appendix 06a (the executor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from course_utils.model_parallel import partition_sequential


@dataclass(frozen=True)
class MLPConfig:
    """``layers`` blocks Linear(width, width)+ReLU, trained on ``batch`` rows; ``seed`` fixes all."""

    width: int = 256
    layers: int = 4
    batch: int = 256
    seed: int = 0

    def build(self, device: str | torch.device | None = None) -> nn.Sequential:
        """The whole model, the same on every process (weights from ``seed``); on ``"meta"``:
        shapes only, nothing initialised."""
        if torch.device(device or "cpu").type == "meta":
            with torch.device("meta"):
                return self._blocks()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self._blocks()

    def _blocks(self) -> nn.Sequential:
        return nn.Sequential(
            *[nn.Sequential(nn.Linear(self.width, self.width), nn.ReLU()) for _ in range(self.layers)]
        )

    def data(self, device: str | torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, both ``[batch, width]`` float32 (on ``"meta"``: shapes only)."""
        if torch.device(device or "cpu").type == "meta":
            return tuple(torch.empty(self.batch, self.width, device="meta") for _ in range(2))
        gen = torch.Generator().manual_seed(self.seed + 1)
        return torch.randn(self.batch, self.width, generator=gen), torch.rand(
            self.batch, self.width, generator=gen
        )

    def stages(self, num_stages: int, device: str | torch.device | None = None) -> list[nn.Sequential]:
        """The model cut into ``num_stages`` equal stages (layer names kept)."""
        if self.layers % num_stages:
            raise ValueError(
                f"{self.layers} layers cannot be cut into {num_stages} equal stages "
                f"(p x v = {num_stages}): choose layers as a multiple of {num_stages}"
            )
        return partition_sequential(self.build(device), num_stages)

    def microbatches(self, m: int, device: str | torch.device | None = None) -> tuple[tuple, tuple]:
        """The data cut into ``m`` equal micro-batches of ``[batch / m, width]``."""
        if self.batch % m:
            raise ValueError(
                f"batch {self.batch} cannot be cut into {m} equal micro-batches: "
                f"choose m dividing {self.batch}"
            )
        x, y = self.data(device)
        return x.chunk(m), y.chunk(m)


loss_fn = nn.MSELoss()


def reference_step(config: MLPConfig) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward + backward of the whole model on the whole batch, in this process:
    the loss and every parameter's gradient, by name."""
    model = config.build()
    x, y = config.data()
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}
