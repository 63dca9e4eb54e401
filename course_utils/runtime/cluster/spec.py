"""``Cluster``: the GPUs and the network that the ranks' virtual time models.

    Cluster(device="h100", network="nvlink")               # an 8xH100 NVLink node, say
    Cluster(device="a100", network="infiniband", gpus_per_node=8)
    Cluster(device=DEVICES["t4"].replace(compute_efficiency=0.5), network=Wire(10e-6, 16e9))

Each argument takes a preset name or an object (``Device``, ``Wire``). ``gpus_per_node`` groups
the ranks into nodes for a network with a node tier (NVLink inside, InfiniBand between).
``tf32``: float32 matrix products at the TF32 tensor-core peak (PyTorch's default is False).
``overlap_speed``: how fast compute runs while a collective's NCCL kernels hold some of the
GPU's SMs; by default the share of SMs left, ``(sms - comm_sms) / sms``.

A torchrun script takes its cluster from ``COURSE_CLUSTER``: ``device:network`` in preset names
(``COURSE_CLUSTER=h100:nvlink``, ``a100:infiniband:8`` for 8 GPUs per node), or the JSON of
``Cluster.to_json()``.

Taught in chapter 02 (the modeled cluster).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from course_utils.runtime.cluster.devices import DEVICES, Device, device
from course_utils.runtime.cluster.network import NETWORKS, Wire, network

__all__ = ["Cluster", "ENV"]

ENV = "COURSE_CLUSTER"  #: the environment variable that carries a Cluster to torchrun's ranks


@dataclass(frozen=True, init=False)
class Cluster:
    """A modeled GPU cluster: ``device`` (a ``Device``) on ``network`` (a ``Wire``)."""

    device: Device
    network: Wire
    tf32: bool = False
    overlap_speed: float | None = None

    def __init__(
        self,
        device: str | Device = "h100",
        network: str | Wire = "nvlink",
        gpus_per_node: int | None = None,
        tf32: bool = False,
        overlap_speed: float | None = None,
    ):
        chosen = _network(network)
        if gpus_per_node is not None:
            chosen = chosen.with_nodes(gpus_per_node)
        object.__setattr__(self, "device", _device(device))
        object.__setattr__(self, "network", chosen)
        object.__setattr__(self, "tf32", bool(tf32))
        if overlap_speed is not None and not (
            isinstance(overlap_speed, (int, float))
            and math.isfinite(overlap_speed)
            and 0 < overlap_speed <= 1
        ):
            raise ValueError(f"Cluster(overlap_speed=...) is a fraction in (0, 1], got {overlap_speed!r}")
        object.__setattr__(self, "overlap_speed", overlap_speed)

    @property
    def compute_speed_during_communication(self) -> float:
        """The fraction of its speed compute keeps while a collective runs on the same GPU."""
        if self.overlap_speed is not None:
            return self.overlap_speed
        free = max(self.device.sms - self.network.comm_sms, 1)
        return free / self.device.sms

    @property
    def label(self) -> str:
        """What every line printed under this cluster names: ``modeled H100 SXM on NVLink 4 ...``."""
        return f"modeled {self.device.name} on {self.network.name}"

    # -- carried to the ranks ------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "device": dataclasses.asdict(self.device),
                "network": dataclasses.asdict(self.network),
                "tf32": self.tf32,
                "overlap_speed": self.overlap_speed,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Cluster:
        data = json.loads(text)
        return cls(
            Device(**data["device"]), Wire(**data["network"]), None, data["tf32"], data["overlap_speed"]
        )

    @classmethod
    def from_env(cls, text: str) -> Cluster:
        """The cluster ``COURSE_CLUSTER`` describes (``h100:nvlink``, ``a100:infiniband:8``, or JSON);
        a bad value raises a ValueError, one line, naming the presets."""
        text = text.strip()
        try:
            if text.startswith("{"):
                return cls.from_json(text)
            parts = text.split(":")
            if len(parts) not in (2, 3):
                raise ValueError("expected DEVICE:NETWORK or DEVICE:NETWORK:GPUS_PER_NODE")
            per_node = int(parts[2]) if len(parts) == 3 else None
            return cls(parts[0], parts[1], per_node)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(
                f"{ENV}={text!r} is not a cluster ({exc}); use DEVICE:NETWORK[:GPUS_PER_NODE] with a device "
                f"of {', '.join(DEVICES)} and a network of {', '.join(NETWORKS)} (say {ENV}=h100:nvlink), "
                "or Cluster(...).to_json()"
            ) from None


def _device(value) -> Device:
    if isinstance(value, Device):
        return value
    if isinstance(value, str):
        return device(value)
    raise TypeError(
        f"Cluster(device=...) takes a preset name ({', '.join(DEVICES)}) or a Device, got {value!r}"
    )


def _network(value) -> Wire:
    if isinstance(value, Wire):
        return value
    if isinstance(value, str):
        return network(value)
    raise TypeError(
        f"Cluster(network=...) takes a preset name ({', '.join(NETWORKS)}) or a Wire, got {value!r}"
    )
