"""TorchRec's sharded lookups against ours and against ``F.embedding_bag``, where TorchRec installs.

    python -m course_utils.scripts.torchrec_check          # in an environment that has torchrec

TorchRec is not a course dependency (chapter 07 says why). In a throwaway environment that
has it, this script shards one ``EmbeddingBagCollection`` of 3 tables with each of TorchRec's
sharding types on 2 CPU ranks (gloo, on GPU machines too: fbgemm-gpu-cpu has CPU kernels
only), looks up each rank's bags of 2 ids, gathers the sharded weights, and compares
TorchRec's pooled embeddings with ``F.embedding_bag`` on the whole tables and with the
course's own sharded lookup of the same kind built from the same weights. A type TorchRec
refuses on CPU is reported with TorchRec's message.

A combination that installs beside torch 2.13.0 (each with ``pip install --no-deps``):
torchrec 1.8.0, fbgemm-gpu-cpu 1.8.0, tensordict, torchmetrics, lightning-utilities,
pyre-extensions, typing-inspect, mypy-extensions, tqdm, pyvers, orjson, cloudpickle.

Taught in chapter 07 (section 10, TorchRec's sharding types).
"""

from __future__ import annotations

CARDS, DIM, BATCH, POOLING = [1000, 300, 50], 16, 4, 2
TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")


def _gather_tables(model, world: int) -> list:
    """The whole tables ``[N_t, DIM]`` from every rank's pieces of the sharded state dict."""
    import torch
    import torch.distributed as dist

    from course_utils.hardware import rank_device

    pieces = []
    for key, value in model.state_dict().items():
        table = int(key.split("embedding_bags.t")[1].split(".")[0])
        if hasattr(value, "local_shards"):
            pieces += [
                (table, tuple(s.metadata.shard_offsets), s.tensor.detach().clone())
                for s in value.local_shards()
            ]
        else:
            pieces.append((table, (0, 0), value.detach().clone()))
    everyone = [None] * world
    dist.all_gather_object(everyone, pieces)
    tables = [torch.zeros(n, DIM, device=rank_device()) for n in CARDS]
    for table, (row, col), t in (p for rank_pieces in everyone for p in rank_pieces):
        tables[table][row : row + t.shape[0], col : col + t.shape[1]] = t.to(tables[table].device)
    return tables


def compare(kind: str) -> dict:
    """In every rank: TorchRec's ``kind`` lookup vs whole tables vs the course's lookup."""
    import logging
    import warnings

    import torch
    import torch.distributed as dist
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from course_utils import sharding
    from course_utils.hardware import rank_device

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rank, world, device = dist.get_rank(), dist.get_world_size(), rank_device()
    configs = [
        torchrec.EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=DIM, num_embeddings=n, feature_names=[f"f{t}"]
        )
        for t, n in enumerate(CARDS)
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=configs, device=device)
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type),
        constraints={f"t{t}": ParameterConstraints(sharding_types=[kind]) for t in range(len(CARDS))},
    )
    from torchrec.distributed.sharding_plan import get_default_sharders

    try:  # every rank plans for itself (the same plan): a refusal then stops every rank, none waits
        plan = planner.plan(ebc, get_default_sharders())
    except RuntimeError as err:
        return {"kind": kind, "refused": str(err).split(". Module:")[0]}
    model = DistributedModelParallel(ebc, device=device, plan=plan)
    g = torch.Generator().manual_seed(1)  # the same ids on every rank
    ids = torch.stack([torch.randint(0, n, (world * BATCH, POOLING), generator=g) for n in CARDS], 1).to(
        device
    )
    mine = ids[rank * BATCH : (rank + 1) * BATCH]  # [B, T, L]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{t}" for t in range(len(CARDS))],
        values=mine.permute(1, 0, 2).reshape(-1),
        lengths=torch.full((len(CARDS) * BATCH,), POOLING, dtype=torch.int32, device=device),
    )
    out = model(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    theirs = torch.stack([out[f"f{t}"] for t in range(len(CARDS))], dim=1)  # [B, T, D]
    tables = _gather_tables(model, world)
    result = {
        "kind": kind,
        "vs_embedding_bag": (theirs - sharding.lookup_unsharded(tables, mine)).abs().max().item(),
    }
    if kind in sharding.SHARDING_KINDS:
        ours = sharding.shard_embeddings(sharding.make_plan(kind, CARDS, DIM, world), tables)(mine)
        result["vs_course"] = (theirs - ours).abs().max().item()
    return result


def main() -> None:
    try:
        import torchrec  # noqa: F401
    except Exception as exc:  # ImportError, or OSError from an fbgemm_gpu built for another torch
        raise SystemExit(
            f"torchrec does not import here ({type(exc).__name__}: {str(exc)[:200]}); "
            "see this script's docstring for a combination that works beside torch 2.13"
        ) from None
    from course_utils import launch

    for kind in TYPES:
        results = launch(compare, kind, world_size=2, backend="gloo", timeout=300, show_output=False)
        if "refused" in results[0]:
            print(f"{kind:14s} refused on CPU: {results[0]['refused']}")
            continue
        worst = {k: max(r[k] for r in results) for k in results[0] if k.startswith("vs_")}
        print(f"{kind:14s} " + ", ".join(f"max |TorchRec - {k[3:]}| = {v:.1e}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
