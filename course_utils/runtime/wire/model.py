"""A modeled interconnect: how long each collective would take on a chosen network.

The alpha-beta (Hockney) model: a message of ``n`` bytes over one link takes
``alpha + n / beta``, where ``alpha`` is the per-message latency (seconds) and ``beta`` the
link's bandwidth (bytes per second, one direction, per rank). A collective is a sequence of
such messages; its time follows from the algorithm that moves them. The algorithms modelled,
for ``w`` ranks (``w = 1``: nothing moves, 0 s):

* all-reduce, ring (reduce-scatter then all-gather): ``2(w-1) (alpha + n/(w beta))``,
  n = the tensor;
* all-gather, ring: ``(w-1) (alpha + n/(w beta))``, n = the gathered result;
* reduce-scatter, ring: ``(w-1) (alpha + n/(w beta))``, n = the whole input;
* broadcast and reduce, binomial tree: ``ceil(log2 w) (alpha + n/beta)`` (our choice: MPI
  uses a tree; NCCL pipelines a ring, which costs ``(w-1) alpha + n/beta`` for large n);
* all-to-all, direct (each rank sends its w-1 parts at once):
  ``(w-1) alpha + max(sent, received)/beta``, the larger over all ranks, own part excluded;
* gather and scatter, linear (the root's link carries w-1 parts): ``(w-1) (alpha + part/beta)``;
* barrier, dissemination: ``ceil(log2 w) alpha``;
* send / recv, one message: ``alpha + n/beta``.

The ring formulas are those of Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH" (2005), and of NCCL's ring algorithm.

Two tiers (``ranks_per_node``): ranks ``[k r, (k+1) r)`` stand for one node. A message
between two ranks of one node uses the node tier (``node_latency_s``, ``node_bandwidth_Bps``,
NVLink say); a collective whose group spans nodes runs at the slower tier's pace (a ring is as
fast as its slowest link).

Presets (``PRESETS``) hold published hardware numbers in real seconds. ``Wire.scaled(s)``
stretches time by ``s`` (``alpha`` x s, ``beta`` / s), so that the ratio the lessons depend on,
computation per byte communicated, is a GPU's on this CPU (``calibrate.time_scale``).

Taught in chapter 02 (the alpha-beta model, fitted) and chapter 04 (overlap under a wire).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

__all__ = ["Wire", "PRESETS", "preset", "collective_seconds", "OPERATIONS"]

OPERATIONS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "send",
)


@dataclass(frozen=True)
class Wire:
    """A network for ``launch(..., wire=...)``: latency ``alpha`` and bandwidth ``beta`` per rank.

    ``latency_s`` and ``bandwidth_Bps`` are the link between nodes (or between any two ranks
    when ``ranks_per_node`` is None). ``time_scale`` says how many of this machine's seconds
    stand for one real second; ``alpha``/``beta`` are the values in force here.
    """

    latency_s: float
    bandwidth_Bps: float
    name: str = "custom wire"
    ranks_per_node: int | None = None
    node_latency_s: float | None = None
    node_bandwidth_Bps: float | None = None
    time_scale: float = 1.0
    source: str = ""

    def __post_init__(self):
        for field in ("latency_s", "bandwidth_Bps", "time_scale"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"Wire.{field} must be a finite number, got {value!r}")
        if self.latency_s < 0:
            raise ValueError(f"Wire.latency_s must be >= 0 seconds, got {self.latency_s!r}")
        if self.bandwidth_Bps <= 0 or self.time_scale <= 0:
            raise ValueError(
                f"Wire.bandwidth_Bps and Wire.time_scale must be > 0, got "
                f"{self.bandwidth_Bps!r} and {self.time_scale!r}"
            )
        tier = (self.node_latency_s, self.node_bandwidth_Bps)
        if self.ranks_per_node is not None and None in tier:
            raise ValueError(
                "a two-tier Wire (ranks_per_node set) also needs node_latency_s and "
                f"node_bandwidth_Bps, the link inside a node; got {tier}"
            )
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"Wire.ranks_per_node must be >= 1, got {self.ranks_per_node!r}")

    # -- the link in force on this machine ---------------------------------------------------
    @property
    def alpha(self) -> float:
        """Per-message latency between nodes, in this machine's seconds."""
        return self.latency_s * self.time_scale

    @property
    def beta(self) -> float:
        """Bandwidth between nodes, in bytes per this machine's second."""
        return self.bandwidth_Bps / self.time_scale

    def link(self, ranks: list[int]) -> tuple[float, float]:
        """``(alpha, beta)`` for a message or collective among global ``ranks``."""
        if self.ranks_per_node is None or len({r // self.ranks_per_node for r in ranks}) > 1:
            return self.alpha, self.beta
        return self.node_latency_s * self.time_scale, self.node_bandwidth_Bps / self.time_scale

    def scaled(self, time_scale: float) -> Wire:
        """This network with ``time_scale`` of this machine's seconds per real second."""
        return dataclasses.replace(self, time_scale=float(time_scale))

    @property
    def label(self) -> str:
        """What every line printed under this wire names: the network and its time scale."""
        scale = "real time" if self.time_scale == 1 else "time scaled"
        return f"wire: {self.name} ({scale})"

    def describe(self) -> str:
        """The numbers in force here (they depend on the calibration: a measured line)."""
        return f"alpha {self.alpha * 1e3:.3g} ms, beta {self.beta / 1e6:.3g} MB/s"

    # -- carried to the ranks in an environment variable -------------------------------------
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Wire:
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"COURSE_WIRE must hold a Wire as JSON (Wire(...).to_json()), got {text!r}: {exc}"
            ) from exc


def collective_seconds(
    op: str, nbytes: float, world: int, alpha: float, beta: float, part_bytes: float = 0.0
) -> float:
    """Seconds the model gives ``op`` on ``world`` ranks; formulas in the module docstring.

    ``nbytes``: the tensor (all-reduce, broadcast, reduce, send), the gathered result
    (all-gather), the whole input (reduce-scatter), or for all-to-all the larger of the bytes
    this rank sends to and receives from the others. ``part_bytes``: one rank's part (gather,
    scatter).
    """
    if op not in OPERATIONS:
        raise ValueError(f"unknown operation {op!r}; the model knows {', '.join(OPERATIONS)}")
    w = world
    if op == "send":
        return alpha + nbytes / beta
    if w <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (w - 1) * (alpha + nbytes / (w * beta))
    if op in ("all_gather", "reduce_scatter"):
        return (w - 1) * (alpha + nbytes / (w * beta))
    if op in ("broadcast", "reduce"):
        return math.ceil(math.log2(w)) * (alpha + nbytes / beta)
    if op == "all_to_all":
        return (w - 1) * alpha + nbytes / beta
    if op in ("gather", "scatter"):
        return (w - 1) * (alpha + part_bytes / beta)
    return math.ceil(math.log2(w)) * alpha  # barrier


_DGX_H100 = (
    "NVIDIA DGX H100 datasheet: NVLink 4 at 900 GB/s per GPU both directions (450 GB/s each way), "
    "eight ConnectX-7 400 Gb/s ports, one per GPU"
)
_NCCL = (
    "NCCL all_reduce_perf on 8xH100 SXM: about 370 GB/s bus bandwidth with rings, about 480 GB/s with NVLS "
    "(in-switch reduction), at large sizes (github.com/NVIDIA/nccl-tests/issues/212)"
)

#: Published networks, in real seconds (apply ``Wire.scaled`` before use on this machine).
#: Every rank stands for one node unless ``ranks_per_node`` is given (``preset(...)``); the
#: multi-node presets carry their NVLink tier for that case.
#: Bandwidth is per GPU and per direction; latency is an order of magnitude for one small
#: message through NCCL on that link (a few microseconds inside a node, more across nodes).
PRESETS: dict[str, Wire] = {
    "nvlink": Wire(
        latency_s=5e-6,
        bandwidth_Bps=450e9,
        name="8xH100 NVLink node",
        source=f"{_DGX_H100}; {_NCCL}",
    ),
    "pcie": Wire(
        latency_s=10e-6,
        bandwidth_Bps=64e9,
        name="GPUs on PCIe Gen5 x16",
        source="PCIe 5.0 x16: 64 GB/s each way (128 GB/s both); H100 PCIe datasheet",
    ),
    "infiniband": Wire(
        latency_s=10e-6,
        bandwidth_Bps=50e9,
        name="8-GPU nodes on 400 Gb/s InfiniBand",
        node_latency_s=5e-6,
        node_bandwidth_Bps=450e9,
        source=f"{_DGX_H100}: 400 Gb/s = 50 GB/s per GPU between nodes, NVLink inside",
    ),
    "ethernet": Wire(
        latency_s=30e-6,
        bandwidth_Bps=12.5e9 / 8,
        name="8-GPU nodes on 100 Gb/s Ethernet",
        node_latency_s=5e-6,
        node_bandwidth_Bps=450e9,
        source="100 Gb/s = 12.5 GB/s per node, shared by its 8 GPUs (1.56 GB/s each); NVLink inside",
    ),
}


def preset(name: str, time_scale: float = 1.0, ranks_per_node: int | None = None) -> Wire:
    """The preset ``name`` (see ``PRESETS``), scaled by ``time_scale``.

    ``ranks_per_node``: group the ranks into stand-in nodes of that many (a multi-node preset
    then uses its NVLink tier inside a node); None: every rank is a node of its own.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown wire preset {name!r}; choose one of {', '.join(PRESETS)}")
    chosen = PRESETS[name].scaled(time_scale)
    if ranks_per_node is not None:
        if chosen.node_latency_s is None:
            raise ValueError(f"preset {name!r} is one node: it has no second tier for ranks_per_node")
        chosen = dataclasses.replace(chosen, ranks_per_node=ranks_per_node)
    return chosen
