"""TorchRec's sharded lookups against ours and against ``F.embedding_bag``, where TorchRec installs.

    python -m course_utils.scripts.torchrec_check          # in an environment that has torchrec

TorchRec is not a course dependency (appendix 07a says why and how to install it). In an environment
that has it, this script shards one ``EmbeddingBagCollection`` of 3 tables with each of
TorchRec's sharding types on 2 CPU ranks (gloo, on GPU machines too: fbgemm-gpu-cpu has CPU
kernels only), prints the plan TorchRec's planner chose next to the course's plan of the
same kind, looks up each rank's bags of 2 ids (a ``KeyedJaggedTensor``), gathers the sharded
weights, and compares TorchRec's pooled embeddings with ``F.embedding_bag`` on the whole
tables and with the course's own sharded lookup of the same kind built from the same
weights. A type TorchRec refuses on CPU is reported with TorchRec's message.

A combination that installs beside torch 2.13.0 (torchrec and fbgemm-gpu-cpu with
``pip install --no-deps``): torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0, tensordict, torchmetrics,
lightning-utilities, pyre-extensions, typing-inspect, mypy-extensions, tqdm, pyvers, orjson,
cloudpickle (the exact pins: ``.ci/run``, part 5).

Taught in chapter 07 (appendix 07a, section 2: TorchRec's sharding types on CPU).
"""

from __future__ import annotations

from course_utils.sharding.torchrec_dlrm import describe_plan, require_torchrec, torchrec_missing

CARDS, DIM, BATCH, POOLING = [1000, 300, 50], 16, 4, 2
TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")
__all__ = ["torchrec_missing", "compare", "run", "report", "main"]


def _gather_tables(model, world: int) -> list:
    """The whole tables ``[N_t, DIM]`` from every rank's pieces of the sharded state dict."""
    import torch
    import torch.distributed as dist

    from course_utils.runtime.hardware import rank_device

    pieces = []
    for key, value in model.state_dict().items():
        table = int(key.split("embedding_bags.t")[1].split(".")[0])
        if hasattr(value, "local_shards"):  # a ShardedTensor: this rank's pieces and their offsets
            pieces += [
                (table, tuple(s.metadata.shard_offsets), s.tensor.detach().clone())
                for s in value.local_shards()
            ]
        else:  # data_parallel: the whole table, replicated
            pieces.append((table, (0, 0), value.detach().clone()))
    everyone = [None] * world
    dist.all_gather_object(everyone, pieces)
    tables = [torch.zeros(n, DIM, device=rank_device()) for n in CARDS]
    for table, (row, col), t in (p for rank_pieces in everyone for p in rank_pieces):
        tables[table][row : row + t.shape[0], col : col + t.shape[1]] = t.to(tables[table].device)
    return tables


def _describe_course_plan(plan) -> list[str]:
    """The same lines for a course plan (``course_utils.sharding.ShardingPlan``)."""
    return [
        f"t{t}: {plan.kind}: "
        + "; ".join(
            f"rows {s.rows[0]}:{s.rows[1]} cols {s.cols[0]}:{s.cols[1]} on rank {s.rank}"
            for s in plan.shards
            if s.table == t
        )
        for t in range(plan.n_tables)
    ]


def compare(kind: str) -> dict:
    """In every rank: TorchRec's ``kind`` lookup vs whole tables vs the course's lookup.

    Returns ``{"kind", "torchrec_plan": [lines], "vs_embedding_bag": max abs difference, ...}``
    (``"course_plan"`` and ``"vs_course"`` for the kinds the course builds too), or
    ``{"kind", "refused": TorchRec's message}``.
    """
    # details: imports, and TorchRec's warnings silenced
    import logging
    import warnings

    import torch
    import torch.distributed as dist
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from course_utils import sharding
    from course_utils.runtime.hardware import rank_device

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    # end details
    rank, world, device = dist.get_rank(), dist.get_world_size(), rank_device()
    configs = [  # 3 tables, one feature each, 16 columns
        torchrec.EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{t}"]
        )
        for t, n in enumerate(CARDS)
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=configs, device=device)
    only = ParameterConstraints(  # this sharding type; column blocks of DIM / W (TorchRec's default: 128)
        sharding_types=[kind], min_partition=DIM // world
    )
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type),
        constraints={f"t{t}": only for t in range(len(CARDS))},
    )
    try:  # every rank plans for itself (the same plan): a refusal then stops every rank, none waits
        plan = planner.plan(ebc, get_default_sharders())
    except RuntimeError as err:
        return {"kind": kind, "refused": str(err).split(". Module:")[0]}
    model = DistributedModelParallel(ebc, device=device, plan=plan)
    g = torch.Generator().manual_seed(1)  # the same ids on every rank
    ids = torch.stack([torch.randint(0, n, (world * BATCH, POOLING), generator=g) for n in CARDS], 1)
    mine = ids[rank * BATCH : (rank + 1) * BATCH].to(device)  # [B, T, L], this rank's bags
    kjt = KeyedJaggedTensor.from_lengths_sync(  # jagged ids: per feature, per row, a bag of ids
        keys=[f"f{t}" for t in range(len(CARDS))],
        values=mine.permute(1, 0, 2).reshape(-1),  # feature-major: f0's bags, then f1's, ...
        lengths=torch.full((len(CARDS) * BATCH,), POOLING, dtype=torch.int32, device=device),
    )
    out = model(kjt)  # a KeyedTensor: the pooled [B, D] of every feature
    out = out.wait() if hasattr(out, "wait") else out
    theirs = torch.stack([out[f"f{t}"] for t in range(len(CARDS))], dim=1)  # [B, T, D]
    tables = _gather_tables(model, world)
    result = {
        "kind": kind,
        "torchrec_plan": describe_plan(plan),
        "vs_embedding_bag": (theirs - sharding.lookup_unsharded(tables, mine)).abs().max().item(),
    }
    if kind in sharding.SHARDING_KINDS:  # the course's lookup of the same kind, same weights and ids
        ours = sharding.make_plan(kind, CARDS, DIM, world)
        result["course_plan"] = _describe_course_plan(ours)
        result["vs_course"] = (theirs - sharding.shard_embeddings(ours, tables)(mine)).abs().max().item()
    return result


def run(kinds=TYPES, world_size: int = 2, timeout: float = 300) -> list[dict]:
    """:func:`compare` for each kind on ``world_size`` CPU ranks (gloo); the differences are the
    largest over the ranks, the plans rank 0's. Raises ``RuntimeError`` when torchrec is missing."""
    from course_utils import launch

    missing = torchrec_missing()
    if missing is not None:
        raise RuntimeError(
            f"torchrec does not import here ({missing}); "
            "see course_utils/scripts/torchrec_check.py's docstring for versions that work beside torch 2.13"
        )
    summary = []
    for kind in kinds:
        results = launch(
            compare, kind, world_size=world_size, backend="gloo", timeout=timeout, show_output=False
        )
        merged = dict(results[0])
        for key in merged:
            if key.startswith("vs_"):
                merged[key] = max(r[key] for r in results)
        summary.append(merged)
    return summary


def report(kinds=TYPES) -> None:
    """Print, per sharding type, TorchRec's plan, the course's plan and the differences; where
    torchrec does not import, say so and what this would print."""
    missing = torchrec_missing()
    if missing is not None:
        print(
            f"TorchRec does not import in this environment ({missing}); nothing ran.\n"
            "In an environment that has it (appendix 07a names versions that work beside this torch),\n"
            "this prints, for each sharding type, the plan TorchRec's planner chose for 3 tables on\n"
            "2 CPU ranks next to the course's plan of the same kind, then the largest difference\n"
            "between TorchRec's pooled embeddings and F.embedding_bag's on the gathered tables and\n"
            "this chapter's lookup of the same kind (row_wise: the planner's refusal on CPU)."
        )
        return
    for result in run(kinds):
        kind = result["kind"]
        if "refused" in result:
            print(f"{kind}: refused on CPU: {result['refused']}\n")
            continue
        print(f"{kind}, TorchRec's plan:")
        print("\n".join(f"  {line}" for line in result["torchrec_plan"]))
        if "course_plan" in result:
            print(f"{kind}, the course's plan:")
            print("\n".join(f"  {line}" for line in result["course_plan"]))
        diffs = ", ".join(
            f"max |TorchRec - {k[3:]}| = {v:.1e}" for k, v in result.items() if k.startswith("vs_")
        )
        print(f"  pooled embeddings: {diffs}\n")


def main() -> None:
    try:
        require_torchrec()
    except RuntimeError as missing:
        raise SystemExit(str(missing)) from None
    report()


if __name__ == "__main__":
    main()
