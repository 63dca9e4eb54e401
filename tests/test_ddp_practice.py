"""DDP in practice (appendices 04a and 04b): the sync inside backward, no_sync's placement, mixed precision
with a loss scaler, seeds and norms across ranks, communication hooks' bytes, sparse tables, the
exact AUC, and the input pipeline. Each compared with what must hold, on 2 gloo ranks."""

import numpy as np
import pytest
import torch

from course_utils import Cluster, launch
from course_utils.ddp import (
    comm_hooks,
    evaluation,
    in_backward,
    input_pipeline,
    mixed_precision,
    rank_agreement,
    sparse_tables,
)
from course_utils.ddp.overlap import tower
from course_utils.runtime.cluster import collective_seconds
from course_utils.workload.metrics import auc
from course_utils.workload.models import DLRMConfig

pytestmark = pytest.mark.chapter(4)


def _sync_in_backward_equals_explicit_finish():
    import torch.distributed as dist

    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(32, 64, generator=g)
    grads = {}
    for cls in (in_backward.BucketedDDP, in_backward.SyncInBackward):
        model = cls(tower(64, 4), bucket_cap_mb=0.01, first_bucket_cap_mb=0.01)
        for _ in range(3):  # the buckets are rebuilt after the first
            model.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            model.finish_gradient_sync()  # SyncInBackward: nothing left to do
        grads[cls.__name__] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return grads


@pytest.mark.launches
def test_sync_inside_backward_gives_the_averaged_gradients_of_an_explicit_finish():
    ranks = launch(_sync_in_backward_equals_explicit_finish, world_size=2, timeout=60)
    assert torch.equal(ranks[0]["SyncInBackward"], ranks[0]["BucketedDDP"])
    assert torch.equal(ranks[0]["SyncInBackward"], ranks[1]["SyncInBackward"])


@pytest.mark.launches
def test_no_sync_takes_effect_on_the_forward_it_wraps():
    ranks = launch(in_backward.no_sync_placements, world_size=2, timeout=60)
    counts = {k: v["all_reduces"] for k, v in ranks[0].items()}
    assert counts == {"forward and backward": 1, "backward only": 2, "last forward inside": 1}
    apart = {k: (ranks[0][k]["weights"] - ranks[1][k]["weights"]).abs().max().item() for k in counts}
    assert apart["forward and backward"] == 0 and apart["backward only"] == 0
    assert apart["last forward inside"] > 1e-4  # the last micro-batch was never averaged
    same = (ranks[0]["backward only"]["weights"] - ranks[0]["forward and backward"]["weights"]).abs().max()
    assert same < 1e-6  # averaging is linear: only the messages differ


@pytest.mark.launches
def test_mixed_precision_with_a_scaler_keeps_ranks_identical_and_near_float32():
    ranks = launch(mixed_precision.train_amp, world_size=2, timeout=60)
    assert ranks[0]["dtype"] == "bfloat16"
    assert torch.equal(ranks[0]["amp"]["weights"], ranks[1]["amp"]["weights"])
    assert ranks[0]["amp"]["norms"] == ranks[1]["amp"]["norms"]  # clipped after the sync: one norm
    gap = (ranks[0]["amp"]["weights"] - ranks[0]["float32"]["weights"]).abs().max().item()
    assert 0 < gap < 5e-3
    assert ranks[0]["scale"] == 65536.0  # no inf/NaN: the scale was never cut
    assert max(ranks[0]["float32"]["norms"]) > 0.25  # clipping did clip


@pytest.mark.launches
def test_seeds_and_gradient_norms_across_ranks():
    ranks = launch(rank_agreement.seeds_and_norms, world_size=2, timeout=60)
    shared, own = ranks[0]["per rank"], ranks[1]["per rank"]
    assert shared["weight before"] != own["weight before"] and shared["weight after"] == own["weight after"]
    assert torch.equal(ranks[0]["shared"]["mask"], ranks[1]["shared"]["mask"])
    assert not torch.equal(ranks[0]["per rank"]["mask"], ranks[1]["per rank"]["mask"])
    assert ranks[0]["norm before sync"] != ranks[1]["norm before sync"]
    assert ranks[0]["norm after sync"] == ranks[1]["norm after sync"]


SMALL_DLRM = DLRMConfig((1,) * 4, embedding_dim=16, bottom_mlp=(32, 16), top_mlp=(64, 32))


@pytest.mark.launches
def test_hooks_send_the_bytes_their_formulas_say():
    ranks = launch(
        comm_hooks.hook_traffic, tuple(comm_hooks.HOOKS), SMALL_DLRM, 64, world_size=2, timeout=120
    )
    model = SMALL_DLRM.build()
    full = sum(p.numel() * 4 for p in model.parameters())
    sent = {k: v["bytes"] for k, v in ranks[0].items()}
    assert sent["float32 (DDP's default)"] == full
    assert sent["fp16_compress_hook"] == sent["bf16 (bf16_hook)"] == full // 2
    assert sent["PowerSGD, rank 1"] == comm_hooks.powersgd_bytes(model, 1)
    for name in sent:
        assert torch.equal(ranks[0][name]["weights"], ranks[1][name]["weights"]), name
        assert "communication_ns" not in ranks[0][name]  # no modeled cluster: wall time only


@pytest.mark.launches
def test_hooks_timed_on_a_modeled_cluster_train_as_on_gloo_and_fp16_halves_the_traffic():
    names = ("float32 (DDP's default)", "fp16_compress_hook")
    plain = launch(comm_hooks.hook_traffic, names, SMALL_DLRM, 64, world_size=2, timeout=120)
    cluster = Cluster("h100", "ethernet")
    modeled = launch(
        comm_hooks.hook_traffic, names, SMALL_DLRM, 64, world_size=2, cluster=cluster, timeout=120
    )
    again = launch(comm_hooks.hook_traffic, names, SMALL_DLRM, 64, world_size=2, cluster=cluster, timeout=120)
    for name in names:
        assert torch.equal(plain[0][name]["weights"], modeled[0][name]["weights"]), name
        assert modeled[0][name]["step_ns"] == again[0][name]["step_ns"] > 0  # exact, run after run
    fp32, fp16 = (modeled[0][name] for name in names)
    alpha, beta = cluster.network.link([0, 1])
    by_formula = sum(round(collective_seconds("all_reduce", n, 2, alpha, beta) * 1e9) for n in fp16["sizes"])
    buffers = sum(
        b.numel() * b.element_size() for b in SMALL_DLRM.build().buffers()
    )  # broadcast each forward
    by_formula += round(collective_seconds("broadcast", buffers, 2, alpha, beta) * 1e9)
    assert abs(fp16["communication_ns"] - by_formula) <= len(fp16["sizes"]) + 1
    assert fp16["communication_ns"] < fp32["communication_ns"]  # (a model this small: no faster a step)


@pytest.mark.launches
def test_powersgd_exchanges_bucket_after_bucket_in_the_same_order_on_every_rank():
    from course_utils.ddp.overlap import MLPERF_DLRM

    ranks = launch(comm_hooks.hook_traffic, ("PowerSGD, rank 1",), MLPERF_DLRM, 16, world_size=2, timeout=120)
    mine, theirs = (r["PowerSGD, rank 1"] for r in ranks)
    assert mine["calls"] == 6 and mine["sizes"] == theirs["sizes"]  # two buckets: vectors, P, Q each
    assert torch.equal(mine["weights"], theirs["weights"])


def test_in_bucket_order_returns_the_finished_exchange():
    later = torch.futures.Future()
    hook = comm_hooks.in_bucket_order(lambda state, bucket: later.then(lambda f: f.value() + bucket))
    later.set_result(torch.ones(2))
    done = hook(None, torch.ones(2))
    assert done.done() and torch.equal(done.value(), torch.full((2,), 2.0))


@pytest.mark.launches
def test_powersgd_is_refused_on_a_modeled_cluster_in_one_line_instead_of_hanging():
    from course_utils.runtime.launcher import RankFailedError

    with pytest.raises(RankFailedError, match="launch it without cluster="):
        launch(
            comm_hooks.hook_traffic,
            ("PowerSGD, rank 1",),
            SMALL_DLRM,
            8,
            world_size=2,
            cluster=Cluster("h100", "ethernet"),
            timeout=60,
        )


def test_powersgd_formula_leaves_thin_matrices_uncompressed():
    assert comm_hooks.powersgd_bytes(torch.nn.Linear(128, 1), 1) == 4 * (128 + 1)
    assert comm_hooks.powersgd_bytes(torch.nn.Linear(128, 128), 2) == 4 * (2 * 256 + 128)


@pytest.mark.launches
def test_sparse_table_averaged_after_backward_equals_dense_ddp():
    ranks = launch(evaluation_free_sparse, world_size=2, timeout=60)
    dense, sparse = ranks[0]["dense"], ranks[0]["sparse, averaged after backward"]
    assert torch.equal(dense["weights"], sparse["weights"])
    assert torch.equal(sparse["weights"], ranks[1]["sparse, averaged after backward"]["weights"])
    assert dense["table gradient bytes"] == 2000 * 8 * 4
    assert sparse["table gradient bytes"] == 16 * 3 * (8 + 8 * 4)  # one row per lookup: id + values


def evaluation_free_sparse():
    return sparse_tables.sparse_or_dense(rows=2000, dim=8, batch=16, bag=3, steps=3)


def test_average_sparse_gradient_refuses_a_dense_gradient():
    with pytest.raises(ValueError, match="sparse gradient"):
        sparse_tables.average_sparse_gradient(torch.nn.Parameter(torch.zeros(3)))


@pytest.mark.launches
@pytest.mark.parametrize("split", ["stride", "by column"])
def test_exact_auc_equals_one_process_and_the_mean_of_ranks_does_not(split):
    rng = np.random.default_rng(0)
    prob = rng.uniform(0, 0.5, 4000)
    labels = (rng.uniform(size=4000) < prob).astype(np.float64)
    scores = prob + rng.normal(0, 0.05, 4000)
    key = None if split == "stride" else prob
    ranks = launch(evaluation.auc_two_ways, labels, scores, key, world_size=2, timeout=60)
    assert ranks[0]["exact AUC"] == ranks[1]["exact AUC"] == pytest.approx(auc(labels, scores), abs=1e-12)
    gap = abs(ranks[0]["mean of per-rank AUCs"] - ranks[0]["exact AUC"])
    assert gap > 0.05 if split == "by column" else gap < 0.02


@pytest.mark.launches  # DataLoader worker processes
def test_persistent_workers_serve_every_epoch_with_the_same_rows_as_without():
    kept, fresh = input_pipeline.worker_pids(True), input_pipeline.worker_pids(False)
    assert kept["rows"] == fresh["rows"] and kept["rows"][0] != kept["rows"][1]
    assert kept["pids"][0] == kept["pids"][1] and len(kept["pids"][0]) == 2
    assert not fresh["pids"][0] & fresh["pids"][1]
    batch = input_pipeline.to_device([torch.ones(2)], torch.device("cpu"))
    assert batch[0].device.type == "cpu"
