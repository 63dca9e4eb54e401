"""The modeled network: how long each collective takes, by the alpha-beta model, in real seconds.

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

``comm_sms``: the streaming multiprocessors NCCL's kernels hold while a collective runs (one
per channel, never shared with compute kernels: NVIDIA/nccl issues 689 and 1656). NVLink nodes
run 24 channels (NVIDIA/nccl issue 1225: 24 CTAs for an all-reduce on a DGX A100, two per
NVLink; NCCL logs "24 coll channels" on H100 nodes); PCIe-only machines log "2 coll channels".

Presets (``NETWORKS``) hold published hardware numbers.

Taught in chapter 02 (the alpha-beta model, fitted) and chapter 04 (overlap on a modeled network).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["Wire", "NETWORKS", "network", "collective_seconds", "OPERATIONS"]

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
    """A network: latency ``alpha`` (s) and bandwidth ``beta`` (bytes/s, one way, per rank).

    ``latency_s`` and ``bandwidth_Bps`` are the link between nodes (or between any two ranks
    when ``ranks_per_node`` is None); ``node_latency_s`` and ``node_bandwidth_Bps`` the link
    inside a node of ``ranks_per_node`` ranks. ``comm_sms``: the SMs a collective's kernels
    hold (module docstring).
    """

    latency_s: float
    bandwidth_Bps: float
    name: str = "custom network"
    ranks_per_node: int | None = None
    node_latency_s: float | None = None
    node_bandwidth_Bps: float | None = None
    comm_sms: int = 24
    source: str = ""

    def __post_init__(self):
        for field in ("latency_s", "bandwidth_Bps"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"Wire.{field} must be a finite number, got {value!r}")
        if self.latency_s < 0:
            raise ValueError(f"Wire.latency_s must be >= 0 seconds, got {self.latency_s!r}")
        if self.bandwidth_Bps <= 0:
            raise ValueError(f"Wire.bandwidth_Bps must be > 0 bytes/s, got {self.bandwidth_Bps!r}")
        tier = (self.node_latency_s, self.node_bandwidth_Bps)
        if self.ranks_per_node is not None and None in tier:
            raise ValueError(
                "a two-tier Wire (ranks_per_node set) also needs node_latency_s and "
                f"node_bandwidth_Bps, the link inside a node; got {tier}"
            )
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"Wire.ranks_per_node must be >= 1, got {self.ranks_per_node!r}")
        if not (isinstance(self.comm_sms, int) and self.comm_sms >= 0):
            raise ValueError(f"Wire.comm_sms must be a whole number >= 0, got {self.comm_sms!r}")

    def link(self, ranks: list[int]) -> tuple[float, float]:
        """``(alpha seconds, beta bytes/s)`` for a message or collective among global ``ranks``."""
        if self.ranks_per_node is None or len({r // self.ranks_per_node for r in ranks}) > 1:
            return self.latency_s, self.bandwidth_Bps
        return self.node_latency_s, self.node_bandwidth_Bps

    def with_nodes(self, ranks_per_node: int | None) -> Wire:
        """This network with its ranks grouped into nodes of ``ranks_per_node`` (None: one rank
        per node); only a network with a node tier (NVLink inside, say) can be grouped."""
        if ranks_per_node is None:
            return dataclasses.replace(self, ranks_per_node=None)
        if self.node_latency_s is None or self.node_bandwidth_Bps is None:
            raise ValueError(f"network {self.name!r} is one node: it has no second tier for ranks_per_node")
        return dataclasses.replace(self, ranks_per_node=int(ranks_per_node))

    def describe(self) -> str:
        """The link in numbers: ``alpha 5 us, beta 450 GB/s`` (and the node tier, if any)."""
        text = f"alpha {self.latency_s * 1e6:.3g} us, beta {self.bandwidth_Bps / 1e9:.3g} GB/s"
        if self.ranks_per_node is not None:
            text += (
                f" between nodes of {self.ranks_per_node}; alpha {self.node_latency_s * 1e6:.3g} us, "
                f"beta {self.node_bandwidth_Bps / 1e9:.3g} GB/s inside"
            )
        return text

    # -- carried to the ranks as JSON -----------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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

#: Published networks. Every rank stands for one node unless ``ranks_per_node`` is given
#: (``Cluster(gpus_per_node=8)``); the multi-node presets carry their NVLink tier for that case.
#: Bandwidth is per GPU and per direction; latency is an order of magnitude for one small
#: message through NCCL on that link (a few microseconds inside a node, more across nodes).
NETWORKS: dict[str, Wire] = {
    "nvlink": Wire(
        latency_s=5e-6,
        bandwidth_Bps=450e9,
        name="NVLink 4 (8xH100 node)",
        comm_sms=24,
        source=f"{_DGX_H100}; {_NCCL}",
    ),
    "pcie": Wire(
        latency_s=10e-6,
        bandwidth_Bps=64e9,
        name="PCIe Gen5 x16",
        comm_sms=2,
        source="PCIe 5.0 x16: 64 GB/s each way (128 GB/s both); H100 PCIe datasheet",
    ),
    "pcie-gen3": Wire(
        latency_s=10e-6,
        bandwidth_Bps=16e9,
        name="PCIe Gen3 x16 (2x T4, as on Kaggle)",
        comm_sms=2,
        source="NVIDIA T4 datasheet: PCIe Gen3 x16, 32 GB/s both ways (16 GB/s each way); no NVLink",
    ),
    "infiniband": Wire(
        latency_s=10e-6,
        bandwidth_Bps=50e9,
        name="400 Gb/s InfiniBand between 8-GPU nodes",
        node_latency_s=5e-6,
        node_bandwidth_Bps=450e9,
        comm_sms=24,
        source=f"{_DGX_H100}: 400 Gb/s = 50 GB/s per GPU between nodes, NVLink inside",
    ),
    "ethernet": Wire(
        latency_s=30e-6,
        bandwidth_Bps=12.5e9 / 8,
        name="100 Gb/s Ethernet between 8-GPU nodes",
        node_latency_s=5e-6,
        node_bandwidth_Bps=450e9,
        comm_sms=24,
        source="100 Gb/s = 12.5 GB/s per node, shared by its 8 GPUs (1.56 GB/s each); NVLink inside",
    ),
}


def network(name_or_wire) -> Wire:
    """A ``Wire`` from a preset name ("nvlink", any case) or a ``Wire`` itself."""
    if isinstance(name_or_wire, Wire):
        return name_or_wire
    key = str(name_or_wire).strip().lower()
    if key not in NETWORKS:
        raise ValueError(
            f"unknown network {name_or_wire!r}: choose one of {', '.join(NETWORKS)}, or pass a Wire"
        )
    return NETWORKS[key]
