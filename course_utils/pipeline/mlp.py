"""The model the pipeline chapters run: a deep MLP, cut into stages.

``MLPConfig(width, layers, batch)`` builds ``layers`` blocks ``Linear(width,
width) + ReLU`` (standing for a large dense tower, the kind of model pipelining is for;
a DLRM's own MLPs are far too small to cut),
deterministic data ``x [batch, width]``, ``y [batch, width]``, and the loss,
mean squared error over the whole batch. With ``m`` equal micro-batches, the
sum over micro-batches of ``mse(micro-batch) / m`` is that same loss, so a
pipeline's gradients must equal the unpipelined model's.

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

    def build(self) -> nn.Sequential:
        """The whole model, the same on every process (weights from ``seed``)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return nn.Sequential(
                *[nn.Sequential(nn.Linear(self.width, self.width), nn.ReLU()) for _ in range(self.layers)]
            )

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, both ``[batch, width]`` float32."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        return torch.randn(self.batch, self.width, generator=gen), torch.rand(
            self.batch, self.width, generator=gen
        )

    def stages(self, num_stages: int) -> list[nn.Sequential]:
        """The model cut into ``num_stages`` equal stages (layer names kept)."""
        if self.layers % num_stages:
            raise ValueError(
                f"{self.layers} layers cannot be cut into {num_stages} equal stages "
                f"(p x v = {num_stages}): choose layers as a multiple of {num_stages}"
            )
        return partition_sequential(self.build(), num_stages)

    def microbatches(self, m: int) -> tuple[tuple, tuple]:
        """The data cut into ``m`` equal micro-batches of ``[batch / m, width]``."""
        if self.batch % m:
            raise ValueError(
                f"batch {self.batch} cannot be cut into {m} equal micro-batches: "
                f"choose m dividing {self.batch}"
            )
        x, y = self.data()
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
