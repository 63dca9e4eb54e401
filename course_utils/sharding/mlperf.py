"""MLPerf's DLRM-DCNv2 on one 8-GPU node, priced on the modeled cluster, against a published step.

**The benchmark** (MLPerf Training, ``dlrm_dcnv2``; the model of ``mlcommons/training``,
``recommendation_v2/torchrec_dlrm``, as the submission's own ``train.py`` builds it): 26 tables
of the Criteo 1TB click logs (``TABLE_ROWS``, the largest 40 million rows), multi-hot: each
sample looks up ``MULTI_HOT[t]`` ids of table ``t`` (1 to 100), summed; dimension 128. A bottom
MLP 13-512-256-128, a DCN v2 interaction (3 cross layers of rank 512 on the 3,456 features of
the 26 pooled vectors and the bottom MLP's output), a top MLP 1024-1024-512-256-1; Adagrad;
fp16 mixed precision; 55,296 samples a step (``GLOBAL_BATCH``, the submission's). The reference
implementation itself (its ``README.MD`` and ``dlrm_main.py``) trains with 65,536 samples a step and
Adagrad for the tables and the dense part alike, learning rate 0.005, no warm-up or decay
(appendix 08b).

**The measurement** (``PUBLISHED``): NVIDIA's closed-division submission to MLPerf Training
v4.0 on one DGX H100 (8x H100-SXM5-80GB, NVLink 4 and NVSwitch), system "Eos", NVIDIA Merlin
HugeCTR 24.04: ``mlcommons/training_results_v4.0``,
``NVIDIA/results/eos_ngc24.04_merlin_hugectr/dlrm_dcnv2/result_0.txt``. The run evaluates every
3,793 steps (``eval_interval = floor(0.05 x 4,195,197,692 / 55,296)`` in its ``train.py``); the
log's ``eval_stop`` -> next ``eval_start`` times (``EVAL_GAPS_MS``, and ``run_start`` -> first
``eval_start``) are training only, so the median gap over 3,793 is one step.

**The model** (``mlperf_step``, in every rank of a modeled cluster, every tensor on the meta
device: real sizes, nothing computed, only time):

* tables of at most ``DP_THRESHOLD_BYTES`` (the submission's ``DP_SHARDING_THRESHOLD=0.008``
  GiB, as float32 rows of 128) are data parallel: on every rank, looked up locally, their
  gradient rows added into one buffer that is all-reduced, then updated;
* the others are model parallel (``place_pieces``): a table with more lookups than a rank's
  fair share is cut by rows into as many pieces as it needs (each piece serves ``1/k`` of the
  table's ids: the multi-hot ids are uniform), and the pieces go, most lookups first, to the
  rank with the fewest lookups so far (``place_largest_first``, the chapter's table-wise rule
  with lookups for bytes). The submission's planner (HugeCTR's ``auto``) balances a cost model
  of its own; a split table returns partial sums, as row-wise sharding does;
* ids out, fp16 pooled vectors back, their gradients back: ``exchange``, the chapter's
  all-to-all;
* the optimizer is fused into the backward pass, as FBGEMM and HugeCTR do (chapter 07,
  section 1): each id's gradient row is read and added into its Adagrad sum and its weight in
  place, priced by the rows touched (three kernels here: ``FusedAdagradLookup``); no dense
  table gradient;
* the dense part (``DCNv2Dense``) in fp16, replicated, its gradients all-reduced in buckets
  while backward runs (``BucketedDDP``), then ``torch.optim.Adagrad`` with its multi-tensor
  (``foreach``) kernels, PyTorch's default on GPUs.

Taught in chapter 07 (appendix 07f, section 3: the model against MLPerf).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from course_utils.ddp.bucketed import BucketedDDP
from course_utils.model_parallel.vertical import place_largest_first
from course_utils.runtime import cluster
from course_utils.sharding.alltoall import Traffic, exchange

__all__ = [
    "TABLE_ROWS",
    "MULTI_HOT",
    "DIM",
    "GLOBAL_BATCH",
    "DP_THRESHOLD_BYTES",
    "PUBLISHED",
    "published_step_seconds",
    "Piece",
    "place_pieces",
    "data_parallel_tables",
    "CrossNetwork",
    "DCNv2Dense",
    "FusedAdagradLookup",
    "mlperf_step",
    "split_compute",
]

TABLE_ROWS = (40_000_000, 39_060, 17_295, 7_424, 20_265, 3, 7_122, 1_543, 63, 40_000_000, 3_067_956,
              405_282, 10, 2_209, 11_938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000,
              590_152, 12_973, 108, 36)  # fmt: skip
MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
DIM, N_DENSE, GLOBAL_BATCH = 128, 13, 55_296
BOTTOM, TOP, CROSS_RANK, CROSS_LAYERS = (512, 256, 128), (1024, 1024, 512, 256, 1), 512, 3
DP_THRESHOLD_BYTES = 0.008 * 2**30
LR, EPS = 0.004, 1e-8

# The log's training stretches, ms: run_start -> first eval_start, then each eval_stop -> next eval_start
_TRAIN_GAPS_MS = (13_648, 13_648, 13_387, 13_382, 13_381, 13_382, 13_390, 13_380, 13_389, 13_382, 13_389,
                  13_379, 13_386, 13_387, 13_387, 13_958)  # fmt: skip

#: The published measurement (module docstring).
PUBLISHED = {
    "round": "MLPerf Training v4.0",
    "submitter": "NVIDIA (closed division)",
    "system": "Eos: 1x DGX H100, 8x H100-SXM5-80GB, NVLink 4 + NVSwitch",
    "framework": "NVIDIA Merlin HugeCTR 24.04",
    "log": "mlcommons/training_results_v4.0: "
    "NVIDIA/results/eos_ngc24.04_merlin_hugectr/dlrm_dcnv2/result_0.txt",
    "steps_between_evals": 3_793,
    "train_gaps_ms": _TRAIN_GAPS_MS,
}


def published_step_seconds() -> float:
    """One training step of the published run: the median stretch between evaluations / its steps."""
    return statistics.median(PUBLISHED["train_gaps_ms"]) / 1e3 / PUBLISHED["steps_between_evals"]


# -- the placement ------------------------------------------------------------------------------------


def data_parallel_tables() -> list[int]:
    """Tables small enough to live on every rank (float32 rows of ``DIM``, the submission's threshold)."""
    return [t for t, n in enumerate(TABLE_ROWS) if n * DIM * 4 <= DP_THRESHOLD_BYTES]


@dataclass(frozen=True)
class Piece:
    """Part ``part`` of ``parts`` of table ``table`` (its rows cut evenly), held by ``rank``."""

    table: int
    part: int
    parts: int
    rank: int

    @property
    def rows(self) -> int:
        return -(-TABLE_ROWS[self.table] // self.parts)

    def ids(self, batch: int) -> int:
        """Ids of ``batch`` samples that land on this piece."""
        return -(-MULTI_HOT[self.table] * batch // self.parts)


def place_pieces(world: int) -> list[Piece]:
    """The model-parallel tables on ``world`` ranks (module docstring), ordered by rank, then table."""
    mp = [t for t in range(len(TABLE_ROWS)) if t not in data_parallel_tables()]
    share = sum(MULTI_HOT[t] for t in mp) / world
    cut = [
        (t, p, math.ceil(MULTI_HOT[t] / share)) for t in mp for p in range(math.ceil(MULTI_HOT[t] / share))
    ]
    owner = place_largest_first([MULTI_HOT[t] * GLOBAL_BATCH // k for t, _, k in cut], world)
    pieces = [Piece(t, p, k, r) for (t, p, k), r in zip(cut, owner, strict=True)]
    return sorted(pieces, key=lambda s: (s.rank, s.table, s.part))


# -- the dense part -------------------------------------------------------------------------------


class CrossNetwork(nn.Module):
    """DCN v2's low-rank cross layers: ``x_{l+1} = x_0 * (U_l V_l x_l + b_l) + x_l``; ``[B, d] -> [B, d]``."""

    def __init__(self, width: int, rank: int, layers: int, **factory):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(width, rank, bias=False, **factory) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(rank, width, **factory) for _ in range(layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for down, up in zip(self.down, self.up, strict=True):
            x = x0 * up(down(x)) + x
        return x


def _mlp(widths, last_relu: bool, **factory) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        layers.append(nn.Linear(a, b, **factory))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DCNv2Dense(nn.Module):
    """DLRM-DCNv2 without its tables: ``forward(dense [B, 13], embedded [B, 26, 128]) -> logit [B]``."""

    def __init__(self, **factory):
        super().__init__()
        width = len(TABLE_ROWS) * DIM + BOTTOM[-1]
        self.bottom = _mlp((N_DENSE, *BOTTOM), last_relu=True, **factory)
        self.cross = CrossNetwork(width, CROSS_RANK, CROSS_LAYERS, **factory)
        self.top = _mlp((width, *TOP), last_relu=False, **factory)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = torch.cat([embedded.flatten(1), self.bottom(dense)], dim=1)
        return self.top(self.cross(x)).squeeze(1)


# -- the tables -------------------------------------------------------------------------------------


class FusedAdagradLookup(torch.autograd.Function):
    """Sum-pooled lookup whose backward writes into the table's own buffers (the fused optimizer).

    forward(ids [n], offsets [bags], bag_of_id [n], weight [rows, D], *targets) -> [bags, D].
    Backward reads each id's gradient row and adds it, at that id, into each of ``targets``:
    a model-parallel table's Adagrad sum and its weight (the update, in place: the work of a
    fused row-wise kernel; on the meta device only its cost counts), or a data-parallel
    table's gradient buffer. It returns no gradient for the table itself.
    """

    @staticmethod
    def forward(ctx, ids, offsets, bag_of_id, weight, *targets):
        ctx.save_for_backward(ids, bag_of_id)
        ctx.targets = targets  # written in place: kept as they are, not saved for autograd's checks
        return F.embedding_bag(ids, weight, offsets, mode="sum")

    @staticmethod
    def backward(ctx, grad):
        ids, bag_of_id = ctx.saved_tensors
        with cluster.region("embeddings"):
            rows = grad.float().index_select(0, bag_of_id)  # [n, D]: each id's gradient
            for target in ctx.targets:
                target.index_add_(0, ids, rows)
        return (None,) * (4 + len(ctx.targets))


def _ids(n_ids: int, bags: int, device) -> tuple:
    """Meta stand-ins for one lookup's ids [n], offsets [bags] and the bag of each id [n]."""
    return tuple(torch.empty(n, dtype=torch.int64, device=device) for n in (n_ids, bags, n_ids))


def _table(rows: int, device) -> torch.Tensor:
    return torch.empty(rows, DIM, device=device, requires_grad=True)  # a leaf: autograd reaches it


def mlperf_step(world_batch: int = GLOBAL_BATCH, steps: int = 2) -> dict:
    """Run in every rank of a modeled cluster: ``steps`` training steps of DLRM-DCNv2 (module
    docstring) at ``world_batch`` samples a step, on the meta device. Its compute is named
    ``embeddings`` (lookups, their updates, the partial sums) or ``forward``/``backward`` (the
    dense part). Returns this rank's ``{"step_ns", "window" (start, end ns of the last step),
    "traffic" (its all-to-alls' bytes, ``Traffic.as_dict()``), "pieces" (table pieces held)}``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    B, meta = world_batch // world, torch.device("meta")
    pieces = place_pieces(world)
    mine = [p for p in pieces if p.rank == rank]
    on = [[p for p in pieces if p.rank == d] for d in range(world)]
    dp = data_parallel_tables()
    mp_tables = sorted({p.table for p in pieces})
    tables = [(_ids(world * p.ids(B), world * B, meta), _table(p.rows, meta)) for p in mine]
    adagrad = [torch.empty(p.rows, DIM, device=meta) for p in mine]
    dp_weights = [_table(TABLE_ROWS[t], meta) for t in dp]
    dp_grad = torch.empty(sum(TABLE_ROWS[t] for t in dp), DIM, device=meta)  # one buffer, all-reduced once
    dp_grads = list(dp_grad.split([TABLE_ROWS[t] for t in dp]))
    dense = BucketedDDP(DCNv2Dense(device=meta, dtype=torch.float16))
    adagrad_dense = torch.optim.Adagrad([*dense.parameters(), *dp_weights], lr=LR, eps=EPS, foreach=True)
    traffic = Traffic(world, rank)
    piece_of = torch.empty(len(pieces), dtype=torch.int64, device=meta)  # the table of each partial

    for _ in range(steps):
        traffic.reset()
        dist.barrier()
        start = cluster.modeled_ns()
        with cluster.region("embeddings"):
            # 1. ids out to the pieces' owners; each owner looks its pieces up for every rank's bags
            ids_to = [
                torch.empty(sum(p.ids(B) for p in on[d]), dtype=torch.int64, device=meta)
                for d in range(world)
            ]
            exchange(ids_to, [(ids_to[rank].numel(),)] * world, "ids", traffic)
            pooled = [
                FusedAdagradLookup.apply(*ids, weight, state, weight)
                for (ids, weight), state in zip(tables, adagrad, strict=True)
            ]
            out = torch.stack(pooled, 1).half()  # [W * B, pieces here, D]
            # 2. pooled vectors back (fp16); a split table's partial sums added up
            back = exchange(
                list(out.split(B)), [(B, len(on[d]), DIM) for d in range(world)], "embeddings", traffic
            )
            model_parallel = torch.zeros(B, len(mp_tables), DIM, device=meta, dtype=torch.float16)
            model_parallel = model_parallel.index_add(1, piece_of, torch.cat(back, 1))
            # 3. the data-parallel tables, looked up here; their gradient rows go to a buffer
            local = [
                FusedAdagradLookup.apply(*_ids(MULTI_HOT[t] * B, B, meta), weight, grad)
                for t, weight, grad in zip(dp, dp_weights, dp_grads, strict=True)
            ]
            embedded = torch.cat([model_parallel, torch.stack(local, 1).half()], 1)  # [B, 26, D]
        # 4. the dense part, data parallel
        logit = dense(torch.empty(B, N_DENSE, device=meta, dtype=torch.float16), embedded)
        loss = F.binary_cross_entropy_with_logits(logit, torch.empty(B, device=meta, dtype=torch.float16))
        loss.backward()
        dense.finish_gradient_sync()
        dist.all_reduce(dp_grad)  # summed over the ranks
        for weight, grad in zip(dp_weights, dp_grads, strict=True):
            weight.grad = grad
        adagrad_dense.step()  # multi-tensor kernels (foreach), as on a GPU
        adagrad_dense.zero_grad(set_to_none=True)
        dist.barrier()
    end = cluster.modeled_ns()
    return {"step_ns": end - start, "window": (start, end), "traffic": traffic.as_dict(), "pieces": len(mine)}


def split_compute(timeline, window: tuple[int, int]) -> dict:
    """Per rank, the compute of one modeled step (``window``) by kind: ``{"embeddings": [ns per
    rank], "dense": [...]}`` (everything not in the ``embeddings`` region is the dense part's)."""
    step = timeline.window(*window)
    out = {"embeddings": [], "dense": []}
    for r in step.ranks:
        spans = step.on(r, "compute")
        emb = sum(s.duration_ns for s in spans if s.name == "embeddings")
        out["embeddings"].append(emb)
        out["dense"].append(sum(s.duration_ns for s in spans) - emb)
    return out
