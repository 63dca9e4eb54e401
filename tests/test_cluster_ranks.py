"""course_utils.runtime.cluster on real ranks: numbers untouched, times exact and repeatable.

* results: every operation the course uses gives bit for bit what plain gloo gives, and DDP
  (with and without ``fp16_compress_hook``) trains to the same parameters;
* times: the collectives equal the values ``benchmarks/virtual_time.py`` writes out by hand;
  a DDP run with ``fp16_compress_hook`` and a 1F1B pipeline run give timelines equal to the ones
  stored in ``cluster_timelines.json`` (on every torch CI runs, and with both cores kept busy);
  a model on the meta device costs what the same model with real tensors costs;
* a machine with two GPUs still runs a modeled cluster on the CPU over gloo.

``python tests/test_cluster_ranks.py`` rewrites ``cluster_timelines.json`` (do so only when the
model itself changes, and say why in the commit).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.runtime import hardware, versions
from course_utils.runtime.cluster import Cluster, ClusterTimeline, installed, modeled_ns, timeline

pytestmark = [pytest.mark.chapter(2, 4, 6), pytest.mark.launches]

HERE = Path(__file__).resolve().parent
STORED = HERE / "cluster_timelines.json"
H100 = Cluster("h100", "nvlink")


# -- results: bit for bit what gloo gives ------------------------------------------------------
def every_operation() -> dict:
    """Run every collective and point-to-point call the course uses; return what each produced."""
    w, me = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(me)
    x = torch.randn(12, generator=g)
    out = {}
    t = x.clone()
    dist.all_reduce(t)
    out["all_reduce"] = t
    t = x.clone()
    dist.all_reduce(t, async_op=True).wait()
    out["all_reduce async"] = t
    t = x.clone()
    dist.broadcast(t, src=w - 1)
    out["broadcast"] = t
    t = x.clone()
    dist.reduce(t, dst=0)
    out["reduce"] = t if me == 0 else torch.zeros(0)
    parts = [torch.zeros(12) for _ in range(w)]
    dist.all_gather(parts, x)
    out["all_gather"] = torch.cat(parts)
    flat = torch.zeros(12 * w)
    dist.all_gather_into_tensor(flat, x)
    out["all_gather_into_tensor"] = flat
    mine = torch.zeros(4)
    dist.reduce_scatter_tensor(mine, torch.cat([x[:4]] * w))
    out["reduce_scatter_tensor"] = mine
    mine = torch.zeros(4)
    dist.reduce_scatter(mine, [x[:4] * (k + 1) for k in range(w)])
    out["reduce_scatter"] = mine
    send_splits = [k + 1 for k in range(w)]  # uneven: rank j gets j+1 rows from everyone
    received = torch.zeros((me + 1) * w)
    dist.all_to_all_single(
        received,
        torch.arange(sum(send_splits), dtype=torch.float32) + 100 * me,
        output_split_sizes=[me + 1] * w,
        input_split_sizes=send_splits,
    )
    out["all_to_all_single"] = received
    outs = [torch.zeros(2) for _ in range(w)]
    versions.all_to_all(outs, [x[2 * k : 2 * k + 2] for k in range(w)])
    out["all_to_all"] = torch.cat(outs)
    gathered = [torch.zeros(12) for _ in range(w)] if me == 0 else None
    dist.gather(x, gathered, dst=0)
    out["gather"] = torch.cat(gathered) if me == 0 else torch.zeros(0)
    mine = torch.zeros(3)
    dist.scatter(mine, [torch.full((3,), float(k)) for k in range(w)] if me == 0 else None, src=0)
    out["scatter"] = mine
    right, left = (me + 1) % w, (me - 1) % w
    got = torch.zeros(12)
    if me % 2 == 0:
        dist.send(x, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(x, right)
    out["send/recv"] = got.clone()
    works = [dist.isend(x * 2, right), dist.irecv(got, left)]
    for work in works:
        work.wait()
    out["isend/irecv"] = got.clone()
    ops = [dist.P2POp(dist.isend, x * 3, right), dist.P2POp(dist.irecv, got, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batch_isend_irecv"] = got.clone()
    if me in (0, 1):  # two tags, received in the other order than sent: paired by tag, as gloo pairs them
        a, b = torch.zeros(5), torch.zeros(7)
        if me == 0:
            works = [dist.isend(x[:5], 1, tag=1), dist.isend(x[:7] * 5, 1, tag=2)]
        else:
            works = [dist.irecv(b, 0, tag=2), dist.irecv(a, 0, tag=1)]
        for work in works:
            work.wait()
        out["tags"] = torch.cat([a, b])
    objects = [None] * w
    dist.all_gather_object(objects, {"rank": me, "sum": float(x.sum())})
    out["all_gather_object"] = torch.tensor([o["sum"] for o in objects])
    dist.barrier()
    out["clock moved"] = torch.tensor(float(modeled_ns() > 0 if installed() else 1))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_operation_gives_exactly_what_gloo_gives(world_size):
    plain = launch(every_operation, world_size=world_size)
    modeled = launch(every_operation, world_size=world_size, cluster=H100)
    for rank, (p, m) in enumerate(zip(plain, modeled, strict=True)):
        assert p.keys() == m.keys()
        for name in p:
            assert torch.equal(p[name], m[name]), f"rank {rank}: {name} differs on the modeled cluster"


def train_ddp(hook: bool, steps: int = 4) -> dict:
    """A few DDP steps of a 4-layer tower (several buckets) on rank-specific data; the final
    parameters, the backend, and under a cluster each step's modeled ns and the timeline."""
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(256, 1))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(64, 256, generator=g), torch.randn(64, 1, generator=g)
    steps_ns = []
    for _ in range(steps):
        start = modeled_ns() if installed() else 0
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        steps_ns.append(modeled_ns() - start if installed() else 0)
    return {
        "parameters": [p.detach().clone() for p in model.parameters()],
        "backend": dist.get_backend(),
        "steps_ns": steps_ns,
        "timeline": timeline() if installed() else None,
    }


@pytest.mark.parametrize("hook", [False, True], ids=["default", "fp16_compress_hook"])
def test_ddp_trains_to_the_same_parameters_bit_for_bit(hook):
    plain = launch(train_ddp, hook)
    modeled = launch(train_ddp, hook, cluster=H100)
    assert plain[0]["backend"] == "gloo" and modeled[0]["backend"] == "cluster"
    for rank in range(2):
        for p, m in zip(plain[rank]["parameters"], modeled[rank]["parameters"], strict=True):
            assert torch.equal(p, m)


# -- times ---------------------------------------------------------------------------------------
def test_the_collectives_equal_their_values_by_hand(capsys):
    path = HERE.parent / "benchmarks" / "virtual_time.py"
    spec = importlib.util.spec_from_file_location("virtual_time_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    assert benchmark.check_part_1(), capsys.readouterr().out


def pipeline_timeline() -> ClusterTimeline:
    """1F1B, 2 stages, 4 micro-batches, the course's MLP: the last of two steps' timeline."""
    from course_utils.pipeline import one_f_one_b
    from course_utils.pipeline.mlp import MLPConfig
    from course_utils.pipeline.runs import pipeline_rank

    pipeline_rank([one_f_one_b(2, 4)], MLPConfig(), 2)
    return timeline()


def runs() -> dict:
    """The two runs whose timelines are stored: {name: a JSON-able list of spans}."""
    ddp = launch(train_ddp, True, 3, cluster=H100, show_output=False)
    pipe = launch(pipeline_timeline, world_size=2, cluster=H100, show_output=False)
    as_rows = lambda t: [[s.rank, s.lane, s.name, s.start_ns, s.end_ns] for s in t.spans]  # noqa: E731
    return {
        "ddp fp16_compress_hook, 2 ranks": as_rows(ClusterTimeline.merge(r["timeline"] for r in ddp)),
        "1F1B, 2 stages, 4 micro-batches": as_rows(ClusterTimeline.merge(pipe)),
    }


def test_timelines_equal_the_stored_ones():
    """The same on every run, machine and torch CI tries (2.9.1 with older kernels, 2.11, 2.13)."""
    stored = json.loads(STORED.read_text())
    assert runs() == stored


def test_timelines_hold_with_both_cores_busy():
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        again = runs()
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert again == json.loads(STORED.read_text())


def ddp_by_hand_step(device: str) -> list[int]:
    """Modeled ns of three steps of the course's bucketed DDP on a tower on ``device``."""
    from torch import nn

    from course_utils.ddp.bucketed import BucketedDDP

    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(
            nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)
        )
        x, y = torch.ones(128, 512), torch.ones(128, 1)
    ddp = BucketedDDP(model, bucket_cap_mb=0.5)
    steps = []
    for _ in range(3):
        start = modeled_ns()
        nn.functional.mse_loss(ddp(x), y).backward()
        ddp.finish_gradient_sync()
        steps.append(modeled_ns() - start)
    return steps


def test_a_model_on_the_meta_device_costs_what_real_tensors_cost():
    real = launch(ddp_by_hand_step, "cpu", world_size=4, cluster=H100, show_output=False)
    meta = launch(ddp_by_hand_step, "meta", world_size=4, cluster=H100, show_output=False)
    assert meta == real and real[0][-1] > 0


def backend_and_device() -> tuple[str, str]:
    return dist.get_backend(), str(hardware.rank_device())


def test_a_machine_with_two_gpus_runs_the_cluster_on_gloo(monkeypatch):
    monkeypatch.setattr(hardware, "gpu_count", lambda: 2)  # NVML says: two GPUs
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert hardware.pick_backend(2) == "nccl"  # a plain launch would start NCCL ranks here
    assert launch(backend_and_device, cluster=H100) == [("cluster", "cpu")] * 2


if __name__ == "__main__":
    written = runs()
    lines = ["{"]
    for i, (name, rows) in enumerate(written.items()):
        lines.append(f"  {json.dumps(name)}: [")
        lines += [f"    {json.dumps(row)}," for row in rows[:-1]] + [f"    {json.dumps(rows[-1])}"]
        lines.append("  ]" + ("," if i < len(written) - 1 else ""))
    STORED.write_text("\n".join(lines + ["}"]) + "\n")
    assert json.loads(STORED.read_text()) == written
    print(f"wrote {STORED}")


# -- torchrun: the cluster from COURSE_CLUSTER -------------------------------------------------
TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
from course_utils.runtime.cluster import backend_from_env, installed, modeled_ns
dist.init_process_group(backend_from_env("gloo"))
t = torch.ones(1)
dist.barrier()
start = modeled_ns() if installed() else 0
dist.all_reduce(t)
if dist.get_rank() == 0:
    print("RESULT", dist.get_backend(), t.item(), modeled_ns() - start if installed() else "-")
dist.destroy_process_group()
"""


def test_a_torchrun_script_runs_on_the_cluster_named_in_course_cluster(tmp_path):
    import os

    script = tmp_path / "script.py"
    script.write_text(TORCHRUN_SCRIPT)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("COURSE_CLUSTER", None)

    def result(run):  # the script's line (torchrun may print its own lines too)
        lines = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, run.stdout[-2000:] + run.stderr[-2000:]
        return lines[0]

    plain = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result(plain) == ["gloo", "2.0", "-"]
    modeled = subprocess.run(
        command, env={**env, "COURSE_CLUSTER": "h100:nvlink"}, capture_output=True, text=True, timeout=120
    )
    # 4 bytes on 2 ranks over NVLink: 2 (alpha + 4 / (2 x 450 GB/s)) = 10 000.0089 ns, rounded
    assert result(modeled) == ["cluster", "2.0", "10000"]
    bad = subprocess.run(
        command, env={**env, "COURSE_CLUSTER": "h100"}, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0
    assert "COURSE_CLUSTER='h100' is not a cluster" in bad.stderr and "t4, v100, a100, h100" in bad.stderr


def collectives_on_meta() -> list[int]:
    """Every collective with meta tensors on every rank: only the time moves; and the operators a
    wait charges (none: gloo's own copies are not the GPU's work)."""
    from course_utils.runtime.cluster import charged

    w, me = dist.get_world_size(), dist.get_rank()
    with torch.device("meta"):
        t, out, flat, part = torch.empty(8), torch.empty(8), torch.empty(8 * w), torch.empty(8 // w)
        parts = [torch.empty(8) for _ in range(w)]
    ops_before = charged()["ops"]
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_gather(parts, t)
    dist.all_gather_into_tensor(flat, t)
    dist.reduce_scatter_tensor(part, t)
    dist.all_to_all_single(out, t)
    dist.gather(t, parts if me == 0 else None, dst=0)
    dist.scatter(out, parts if me == 0 else None, src=0)
    return [charged()["ops"] - ops_before, modeled_ns()]


def collectives_on_cpu() -> int:
    """The operators that waiting for gloo's collectives charges on this rank: none."""
    from course_utils.runtime.cluster import charged

    w = dist.get_world_size()
    t = torch.ones(256)
    parts, gathered = [torch.zeros(256) for _ in range(w)], [torch.zeros(256) for _ in range(w)]
    flat = torch.zeros(256 * w)
    before = charged()["ops"]
    dist.all_gather(parts, t)
    dist.all_gather_into_tensor(flat, t)
    dist.gather(t, gathered if dist.get_rank() == 0 else None, dst=0)
    return charged()["ops"] - before


def sparse_all_reduce() -> tuple[torch.Tensor, int]:
    """A sparse gradient of 2 rows of a [200 000, 64] table, all-reduced: its sum and modeled ns."""
    me = dist.get_rank()
    grad = torch.sparse_coo_tensor(torch.tensor([[me, 7]]), torch.ones(2, 64), (200_000, 64))
    dist.barrier()
    start = modeled_ns()
    dist.all_reduce(grad)
    ns = modeled_ns() - start
    return grad.to_dense()[[0, 1, 7]].sum(), ns


def test_a_sparse_all_reduce_sums_and_costs_its_rows_not_its_table():
    (total, ns), _ = launch(sparse_all_reduce, world_size=2, cluster=H100)
    assert total.item() == 4 * 64  # rows 0 and 1 once each, row 7 twice
    # the message is the indices and values, 2 x 8 + 2 x 64 x 4 = 528 bytes, not 51.2 MB:
    # 2 (alpha + 528 / (2 x 450 GB/s)) = 10 000.6 ns
    assert ns == round(2 * (5e-6 + 528 / (2 * 450e9)) * 1e9)


def test_collectives_on_meta_tensors_and_waits_charge_no_operators():
    meta = launch(collectives_on_meta, world_size=2, cluster=H100)
    assert [ops for ops, _ in meta] == [0, 0] and meta[0][1] == meta[1][1] > 0
    assert launch(collectives_on_cpu, world_size=2, cluster=H100) == [0, 0]
