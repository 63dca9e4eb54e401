"""TorchRec's planner on real topologies: MLPerf's DLRM-DCNv2 tables on 1 to 64 modeled H100s.

    topology  = h100_topology(W)                     # W H100s, 8 per host, NVLink inside, 400 Gb/s between
    tables    = mlperf_tables()                      # 26 tables of Criteo 1TB, dim 128, on the meta device
    planned   = plan_tables(W)                       # EmbeddingShardingPlanner, HeuristicalStorageReservation
    planned.plan, planned.stats, planned.error       # a ShardingPlan (or None), the planner's own stats
                                                     # table (its logger's lines), PlannerError's first line

Everything runs on the CPU: the planner only reads the tables' shapes (meta tensors, no memory)
and prices candidate shardings with its cost model (``torchrec/distributed/planner``,
torchrec 1.8.0: ``shard_estimators.py``, ``partitioners.py``, ``stats.py``).

**The topology** (``Topology`` in ``planner/types.py``; its bandwidths are in bytes per
millisecond, its capacities in bytes) comes from the course's presets of the modeled cluster:
``devices.DEVICES["h100"]`` (80 GiB of HBM at 3.35 TB/s) and ``network.NETWORKS["infiniband"]``
(NVLink 4 at 450 GB/s per GPU and direction inside a host of 8, 50 GB/s per GPU between hosts,
DGX H100 datasheet), ``NETWORKS["pcie"]`` for the host link that UVM reads cross (64 GB/s).
Host memory: a DGX H100 has 2 TB, 256 GiB per GPU (``HOST_MEMORY_PER_GPU``).

**The tables** are ``mlperf.TABLE_ROWS`` at ``mlperf.DIM``, each looked up ``mlperf.MULTI_HOT[t]``
times a sample (the benchmark's fixed multi-hot sizes: the pooling factors), trained with row-wise
Adagrad (``torchrec.optim.RowWiseAdagrad``, fused into the backward pass, one float per row,
which the planner counts as ``1 / D`` of a table), with MLPerf's global batch of 55,296 samples.

Taught in chapter 07 (appendix 07b, the planner at scale).
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_utils.runtime.cluster.devices import DEVICES
from course_utils.runtime.cluster.network import NETWORKS
from course_utils.sharding import mlperf

__all__ = [
    "GPUS_PER_HOST",
    "HOST_MEMORY_PER_GPU",
    "SHARDING_TYPES",
    "RESERVED",
    "h100_topology",
    "mlperf_tables",
    "pooling_factors",
    "Planned",
    "plan_tables",
    "placement",
    "rank_memory",
    "planner_rank_rows",
]

GPUS_PER_HOST = 8
HOST_MEMORY_PER_GPU = 2 * 2**40 // GPUS_PER_HOST  # DGX H100: 2 TB of system memory for 8 GPUs
#: The sharding types offered: column-wise ones are left out, since TorchRec's narrowest column
#: block (``MIN_CW_DIM``, ``planner/constants.py``) is 128, the tables' whole width here; and on
#: one host table-row-wise is row-wise (its group is the host), so it is offered on more hosts only.
SHARDING_TYPES = ("data_parallel", "table_wise", "row_wise", "table_row_wise")
RESERVED = 0.15  # HeuristicalStorageReservation's share of every GPU's HBM kept off the tables
_PER_MS = 1e-3  # TorchRec's bandwidths are bytes per millisecond
_STATS_LOGGER = "torchrec.distributed.planner.stats"


def h100_topology(world: int, *, hbm: int | None = None):
    """TorchRec's ``Topology`` of ``world`` H100 SXM GPUs, ``GPUS_PER_HOST`` per host (module
    docstring); ``hbm``: bytes of HBM per GPU (default the H100's 80 GiB)."""
    from torchrec.distributed.planner import Topology

    h100, wires = DEVICES["h100"], NETWORKS["infiniband"]
    return Topology(
        world_size=world,
        compute_device="cuda",  # the device planned for; the planner itself runs here, on the CPU
        local_world_size=min(world, GPUS_PER_HOST),
        hbm_cap=h100.memory_bytes if hbm is None else hbm,
        ddr_cap=HOST_MEMORY_PER_GPU,
        hbm_mem_bw=h100.memory_bandwidth * _PER_MS,
        hbm_to_ddr_mem_bw=NETWORKS["pcie"].bandwidth_Bps * _PER_MS,
        intra_host_bw=wires.node_bandwidth_Bps * _PER_MS,
        inter_host_bw=wires.bandwidth_Bps * _PER_MS,
    )


def mlperf_tables(*, dim: int = mlperf.DIM, max_rows: int | None = None, data_type: str = "fp32"):
    """MLPerf's 26 tables as a TorchRec ``EmbeddingBagCollection`` on the meta device: table ``t{i}``
    of ``mlperf.TABLE_ROWS[i]`` rows (at most ``max_rows``: ids hashed into fewer rows) of ``dim``
    floats (``data_type`` "fp32" or "fp16"), feature ``f{i}``; row-wise Adagrad applied in backward."""
    from torchrec import DataType, EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    rows = [n if max_rows is None else min(n, max_rows) for n in mlperf.TABLE_ROWS]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{t}",
                embedding_dim=dim,
                num_embeddings=n,
                feature_names=[f"f{t}"],
                data_type=DataType[data_type.upper()],
            )
            for t, n in enumerate(rows)
        ],
        device=torch.device("meta"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchRec's wrapper of torch's private one
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": mlperf.LR})
    return ebc


def pooling_factors(kjt) -> dict[str, float]:
    """The pooling factor of each feature of a ``KeyedJaggedTensor``: its ids per bag, on average
    (``lengths`` summed over the batch, divided by the batch)."""
    return {key: float(jt.lengths().double().mean()) for key, jt in kjt.to_dict().items()}


@dataclass
class Planned:
    """What ``plan_tables`` returns: the ``ShardingPlan`` (``None`` if refused), the planner's stats
    table as it logged it (lines, without the ``#`` frame), and its ``PlannerError`` in one line."""

    world: int
    batch_per_rank: int
    plan: object
    stats: list[str]
    error: str | None


def _not_data_parallel_note(record) -> bool:
    """Drop TorchRec's warning that a data-parallel table has no sharding spec (it has none by design:
    ``validate_rank_assignment`` in ``planners.py`` logs it for every such table)."""
    return not record.getMessage().startswith("Sharding spec not found")


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage().strip().strip("#").rstrip())


def plan_tables(
    world: int,
    *,
    dim: int = mlperf.DIM,
    max_rows: int | None = None,
    data_type: str = "fp32",
    kernels: Sequence[str] = ("fused", "dense"),
    pooling: Sequence[float] = mlperf.MULTI_HOT,
    hbm: int | None = None,
) -> Planned:
    """TorchRec's plan for MLPerf's tables (``mlperf_tables(dim, max_rows, data_type)``) on
    ``h100_topology(world, hbm)``: MLPerf's global batch split over the GPUs, ``RESERVED`` of the
    HBM held back by ``HeuristicalStorageReservation``, each table offered ``SHARDING_TYPES``, the
    compute ``kernels`` ("fused": the whole table in HBM; "dense": a data-parallel table in HBM;
    "fused_uvm_caching": in host memory, hot rows cached in HBM) and its pooling factor. Never
    raises ``PlannerError``: see ``error``."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.planner.types import PlannerError

    tables = mlperf_tables(dim=dim, max_rows=max_rows, data_type=data_type)
    kinds = [k for k in SHARDING_TYPES if world > GPUS_PER_HOST or k != "table_row_wise"]
    constraints = {
        f"t{t}": ParameterConstraints(
            sharding_types=kinds, compute_kernels=list(kernels), pooling_factors=[float(p)]
        )
        for t, p in enumerate(pooling)
    }
    batch = mlperf.GLOBAL_BATCH // world
    handler, logger = _Lines(), logging.getLogger(_STATS_LOGGER)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logging.getLogger().addFilter(_not_data_parallel_note)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the reservation's note on dry runs
            planner = EmbeddingShardingPlanner(
                topology=h100_topology(world, hbm=hbm),
                batch_size=batch,
                storage_reservation=HeuristicalStorageReservation(percentage=RESERVED),
                constraints=constraints,
            )
        plan, error = planner.plan(tables, [EmbeddingBagCollectionSharder()]), None
    except PlannerError as exc:
        plan, error = None, f"PlannerError: {str(exc).splitlines()[0].strip()}"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        logging.getLogger().removeFilter(_not_data_parallel_note)
    return Planned(world, batch, plan, handler.lines, error)


_SHORT = {"data_parallel": "DP", "table_wise": "TW", "row_wise": "RW", "table_row_wise": "TWRW"}


def _short(kind: str) -> str:
    return _SHORT.get(kind, kind)


def placement(plan) -> list[str]:
    """One line per table of a plan: its sharding type, compute kernel and the ranks of its shards."""
    lines = []
    for params in plan.plan.values():
        for name in sorted(params, key=lambda n: int(n[1:])):
            p = params[name]
            ranks = sorted(set(p.ranks))
            where = f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else ranks
            where = str(ranks[0]) if len(ranks) == 1 else where
            lines.append(f"{name:4s} {_short(p.sharding_type):5s}{p.compute_kernel:18s}ranks {where}")
    return lines


def rank_memory(
    plan, world: int, *, dim: int = mlperf.DIM, value_bytes: int = 4, max_rows: int | None = None
) -> list[int]:
    """Chapter 07's memory per rank for a plan: for every shard a rank holds, its weights and one
    row-wise Adagrad float per row, ``value_bytes * rows * cols + 4 * rows`` (a data-parallel
    table counts on every rank). UVM-cached shards count too (they live in host memory)."""
    held = [0] * world
    for params in plan.plan.values():
        for name, p in params.items():
            if p.sharding_spec is None:  # data parallel: the whole table on every rank
                rows = mlperf.TABLE_ROWS[int(name[1:])]
                rows = rows if max_rows is None else min(rows, max_rows)
                for r in p.ranks:
                    held[r] += value_bytes * rows * dim + 4 * rows
                continue
            for shard in p.sharding_spec.shards:
                rows, cols = shard.shard_sizes
                held[shard.placement.rank()] += value_bytes * rows * cols + 4 * rows
    return held


_RANK_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+) \(\s*\d+%\)\s+([\d.]+) \(\s*\d+%\)\s+([\d.]+) \(")


def planner_rank_rows(stats: list[str]) -> list[dict]:
    """The planner's per-rank table, read from its stats lines: ``[{"rank", "hbm_gb", "ddr_gb",
    "perf_ms"}]`` (its GB are GiB: ``bytes_to_gb`` divides by 1024**3)."""
    out = []
    for line in stats:
        m = _RANK_ROW.match(line)
        if m:
            out.append(dict(rank=int(m[1]), hbm_gb=float(m[2]), ddr_gb=float(m[3]), perf_ms=float(m[4])))
    return out
