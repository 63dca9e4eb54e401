"""The course's DLRM in TorchRec: sharded tables, the course's dense layers, a fused optimizer.

    every rank: a torchrec Batch of its rows of the global batch
        dense_features [B, 13], labels [B],
        sparse_features: a KeyedJaggedTensor, keys f0 .. f{T-1}, B bags of one id each
    sparse_features --ShardedEmbeddingBagCollection (ids out, FBGEMM lookup, pooled back)-->
        a KeyedTensor, T x [B, D] --stacked--> embedded [B, T, D]
    dense_features, embedded --DenseArch (DDP, the course's bottom MLP, interaction, top MLP)--> logit [B]

``shard`` builds it in every rank: the planner's inputs (``Topology``, one
``ParameterConstraints`` per table: sharding type, compute kernel, pooling factor),
``DistributedModelParallel`` with an ``EmbeddingBagCollectionSharder`` whose ``fused_params``
name FBGEMM's optimizer (the table rows a batch touched are updated inside the backward pass;
no table gradient exists), the tables copied from a course ``DLRM`` so that both start from
the same weights, and the dense optimizer (``torch.optim``, over the parameters DDP averages).

TorchRec is not a course dependency: everything here imports it inside the function that
needs it (``torchrec_missing`` says whether it imports).

Taught in chapter 07 (appendix 07a, TorchRec).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_utils.sharding.hybrid import DenseArch
from course_utils.workload.data import Batch
from course_utils.workload.models import DLRM

__all__ = [
    "NEEDS_TORCHREC",
    "torchrec_missing",
    "require_torchrec",
    "quiet",
    "TorchRecDLRM",
    "to_torchrec_batch",
    "FUSED_OPTIMIZERS",
    "fused_sharder",
    "plan_tables",
    "shard",
    "describe_plan",
    "table_index",
    "copy_tables",
    "local_tensors",
]

#: The optimizers ``shard`` fuses into the tables' backward (FBGEMM's names, all three run on
#: CPU), and the ``torch.optim`` class that updates the dense layers alongside.
FUSED_OPTIMIZERS = {
    "adagrad": ("EXACT_ADAGRAD", torch.optim.Adagrad),  # a running sum per value, as torch's
    "rowwise_adagrad": ("EXACT_ROWWISE_ADAGRAD", torch.optim.Adagrad),  # one sum per table row
    "sgd": ("EXACT_SGD", torch.optim.SGD),
}
KINDS = ("table_wise", "column_wise")  # what TorchRec and the course both shard on CPU
# the notebooks that run TorchRec (appendices 07a, 07b)
NEEDS_TORCHREC = frozenset({"07a_torchrec.ipynb", "07b_planner_at_scale.ipynb"})
TABLES = "sparse.embedding_bags."  # the tables' keys: sparse.embedding_bags.t<table>.weight


def table_index(key: str) -> int:
    """The table of a state-dict key ``sparse.embedding_bags.t<table>.weight``."""
    return int(key[len(TABLES) :].split(".")[0][1:])


def torchrec_missing() -> str | None:
    """``None`` when torchrec imports here, else why not (one line)."""
    try:
        import torchrec  # noqa: F401
    except Exception as exc:  # ImportError, or OSError from an fbgemm_gpu built for another torch
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def quiet() -> None:
    """Keep TorchRec's and FBGEMM's notes for production jobs (planner advice, deprecations, a
    torch.fx note that TorchRec's jagged tensors trigger) out of this process's output."""
    import logging
    import warnings

    for name in ("torchrec", "fbgemm_gpu", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(torchrec|fbgemm_gpu)(\.|$)")


def require_torchrec() -> None:
    """Raise ``RuntimeError`` saying what to install where torchrec does not import."""
    missing = torchrec_missing()
    if missing is not None:
        raise RuntimeError(
            f"torchrec does not import here ({missing}). Beside torch 2.13.0 (CPU): "
            "pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0, then its small "
            "pure-Python dependencies (appendix 07a, section 1, lists them)"
        )


class TorchRecDLRM(nn.Module):
    """The course's DLRM with its tables in a TorchRec ``EmbeddingBagCollection``.

    ``model``: the course ``DLRM`` whose shape (and dense layers: ``DenseArch``) this copies; the
    tables are made on the meta device (no memory), for ``DistributedModelParallel`` to allocate
    each rank's shards. ``forward(batch)`` takes a torchrec ``Batch`` (``to_torchrec_batch``) and
    returns ``(loss, (loss, logits [B]))``, the mean binary cross-entropy of its rows: the pair
    ``TrainPipelineSparseDist`` expects (it back-propagates the first, returns the second, detached).
    """

    def __init__(self, model: DLRM):
        if not isinstance(model, DLRM):
            raise TypeError(f"expected a course DLRM to copy, got {type(model).__name__}")
        import torchrec

        super().__init__()
        config = model.config
        self.features = [f"f{t}" for t in range(config.n_tables)]  # one feature per table
        self.dim = config.embedding_dim
        self.sparse = torchrec.EmbeddingBagCollection(
            tables=[
                torchrec.EmbeddingBagConfig(
                    name=f"t{t}", embedding_dim=config.embedding_dim, num_embeddings=n, feature_names=[f]
                )
                for t, (n, f) in enumerate(zip(config.cardinalities, self.features, strict=True))
            ],
            device=torch.device("meta"),
        )
        self.dense = DenseArch(model)

    def forward(self, batch):
        pooled = self.sparse(batch.sparse_features)  # KeyedTensor: per feature, [B, D]
        embedded = torch.stack([pooled[f] for f in self.features], dim=1)  # [B, T, D]
        logits = self.dense(batch.dense_features, embedded)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())


def to_torchrec_batch(batch: Batch):
    """A course ``Batch`` (dense ``[B, 13]``, sparse ids ``[B, T]``, label ``[B]``) as a torchrec
    ``Batch``: the ids as a ``KeyedJaggedTensor``, values feature-major (f0's B ids, then f1's ...)
    and one length per (feature, row), here all 1: each bag holds one id."""
    from torchrec.datasets.utils import Batch as TorchRecBatch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dense, sparse, label = batch
    if sparse.dim() != 2:
        raise ValueError(f"expected sparse ids [B, T] (one id per table and row), got {tuple(sparse.shape)}")
    B, T = sparse.shape
    kjt = KeyedJaggedTensor(
        keys=[f"f{t}" for t in range(T)],
        values=sparse.t().reshape(-1),  # [T * B]
        lengths=torch.ones(T * B, dtype=torch.int32),
    )
    return TorchRecBatch(dense_features=dense, sparse_features=kjt, labels=label)


def fused_sharder(optimizer: str, lr: float, eps: float):
    """The ``EmbeddingBagCollectionSharder`` whose ``fused_params`` give FBGEMM's ``optimizer``
    (``FUSED_OPTIMIZERS``), learning rate and ``eps``: what updates the table rows in backward."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    if optimizer not in FUSED_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(FUSED_OPTIMIZERS)}, got {optimizer!r}")
    fused = {"optimizer": EmbOptimType[FUSED_OPTIMIZERS[optimizer][0]], "learning_rate": lr}
    if optimizer != "sgd":
        fused["eps"] = eps
    return EmbeddingBagCollectionSharder(fused_params=fused)


def plan_tables(model: TorchRecDLRM, sharder, kind: str = "table_wise", batch_per_rank: int = 512):
    """TorchRec's plan for ``model``'s tables on this group's ranks (every rank gets rank 0's).

    The planner's inputs: the ``Topology`` (``W`` CPU ranks), the batch per rank, and for each
    table a ``ParameterConstraints``: the one sharding type allowed (``kind``), FBGEMM's ``fused``
    kernel, and a pooling factor of 1 (one id per bag, what the planner's cost model assumes).
    Column-wise blocks are ``D / W`` wide (TorchRec's default minimum is 128 columns).
    """
    # details: imports, and the sharding types TorchRec and the course both run on CPU
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (TorchRec offers row_wise on CUDA only), got {kind!r}")
    # end details
    world = dist.get_world_size()
    only = ParameterConstraints(
        sharding_types=[kind],
        compute_kernels=["fused"],
        pooling_factors=[1.0],
        min_partition=model.dim // world,
    )
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu", local_world_size=world),
        batch_size=batch_per_rank,
        constraints={f"t{t}": only for t in range(len(model.features))},
    )
    return planner.collective_plan(model, [sharder], dist.group.WORLD)


@torch.no_grad()
def copy_tables(sharded, model: DLRM) -> int:
    """Copy each of this rank's table shards from ``model``'s whole tables (same start as the course's
    model); returns the number of values copied here."""
    copied = 0
    for key, value in sharded.state_dict().items():
        if not key.startswith(TABLES):
            continue
        table = table_index(key)
        for piece in value.local_shards():  # views of FBGEMM's weights: copy_ writes there
            (row, col), (rows, cols) = piece.metadata.shard_offsets, piece.metadata.shard_sizes
            piece.tensor.copy_(model.embeddings[table].weight[row : row + rows, col : col + cols])
            copied += piece.tensor.numel()
    return copied


def shard(
    model: DLRM,
    kind: str = "table_wise",
    *,
    optimizer: str = "adagrad",
    lr: float = 0.02,
    eps: float = 1e-10,
    batch_per_rank: int = 512,
):
    """Build the TorchRec twin of ``model`` in every rank: ``(sharded model, optimizer, plan)``.

    The sharded model is a ``DistributedModelParallel`` of ``TorchRecDLRM(model)``: its tables cut by
    ``plan_tables`` (``kind``), FBGEMM's ``optimizer`` fused into them (``FUSED_OPTIMIZERS``), its
    tables and dense layers copied from ``model``. The optimizer combines the fused one (its
    ``step`` does nothing: the rows were updated in backward) with ``torch.optim`` over the dense
    layers, with the same ``lr`` and ``eps``.
    """
    # details: imports (TorchRec's, here: it is not a course dependency)
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    require_torchrec()
    quiet()
    # end details
    sharder = fused_sharder(optimizer, lr, eps)
    twin = TorchRecDLRM(model)
    plan = plan_tables(twin, sharder, kind, batch_per_rank)
    sharded = DistributedModelParallel(twin, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    copy_tables(sharded, model)
    dense_class = FUSED_OPTIMIZERS[optimizer][1]
    options = {"lr": lr} if dense_class is torch.optim.SGD else {"lr": lr, "eps": eps}
    dense = {name: p for name, p in sharded.named_parameters() if not name.startswith("sparse.")}
    opt = CombinedOptimizer(
        [sharded.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: dense_class(ps, **options))]
    )
    return sharded, opt, plan


def describe_plan(plan) -> list[str]:
    """One line per table of a TorchRec plan: its sharding type and each shard's rows, columns, rank."""
    lines = []
    for module_plan in plan.plan.values():
        for name, p in module_plan.items():
            spec = getattr(p.sharding_spec, "shards", None)
            if not spec:
                lines.append(f"{name}: {p.sharding_type} on ranks {p.ranks} (whole table)")
                continue
            pieces = [
                f"rows {o[0]}:{o[0] + s[0]} cols {o[1]}:{o[1] + s[1]} on rank {m.placement.rank()}"
                for m in spec
                for o, s in [(m.shard_offsets, m.shard_sizes)]
            ]
            lines.append(f"{name}: {p.sharding_type}: " + "; ".join(pieces))
    return lines


def local_tensors(sharded, optimizer) -> dict[str, torch.Tensor]:
    """CPU copies of what this rank holds of the model and its optimizer, by name: each table's
    local shards (``<key>@<row>,<col>``), the dense layers, the fused optimizer's state (row-wise
    or element-wise sums) and the dense optimizer's. Two runs equal bit for bit have equal dicts."""
    out = {}
    for prefix, state in (("model", sharded.state_dict()), ("optim", optimizer.state_dict()["state"])):
        if prefix == "optim":  # {parameter: {state name: tensor}}
            state = {f"{key}/{name}": v for key, named in state.items() for name, v in named.items()}
        for key, value in state.items():
            if hasattr(value, "local_shards"):  # a ShardedTensor: this rank's pieces
                for piece in value.local_shards():
                    at = ",".join(map(str, piece.metadata.shard_offsets))
                    out[f"{prefix}/{key}@{at}"] = piece.tensor.detach().clone()
            elif isinstance(value, torch.Tensor):
                out[f"{prefix}/{key}"] = value.detach().clone()
    return out
